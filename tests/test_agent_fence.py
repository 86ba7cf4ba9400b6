"""The agent ignores assignments fenced by an older leader, and remembers the newest fence."""

from __future__ import annotations

from types import SimpleNamespace

from hfai.agent.service import Agent
from hfai.core.config import AgentConfig, Config
from hfai.protocol import encode
from hfai.protocol.types import DesiredRun, NodeAssignment, RunAssignment


def _assignment(fence: int, job: str) -> SimpleNamespace:
    ra = RunAssignment(job_id=job, run_id=1, name="n", user="u", group="default", priority=10, rank=0,
                       world_size=1, master_addr="a", master_port=1, entrypoint=("true",), workdir="/",
                       desired=DesiredRun.RUN)
    value = encode(NodeAssignment(node="n0", fence=fence, runs=(ra,)))
    return SimpleNamespace(value=value, operation=None)


def test_stale_fence_is_ignored_and_fence_survives_restart(tmp_path):
    cfg = Config(agent=AgentConfig(node="n0", state_dir=str(tmp_path), env_root=str(tmp_path / "envs"),
                                   gpu_source="sim"))
    agent = Agent(cfg)
    agent.assignment.on_assignment(_assignment(10, "new"))
    assert list(agent.assignment.desired) == ["new.1"]
    agent.assignment.on_assignment(_assignment(9, "old"))
    assert list(agent.assignment.desired) == ["new.1"]
    restarted = Agent(cfg)
    restarted.assignment.on_assignment(_assignment(9, "old"))
    assert restarted.assignment.desired == {}
    restarted.assignment.on_assignment(_assignment(11, "newer"))
    assert list(restarted.assignment.desired) == ["newer.1"]
