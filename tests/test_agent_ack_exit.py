"""A job that acknowledged a suspend exits by itself within the grace and its real exit status is
recorded (issue 13, defect 11): real agent store, real launcher, a job with spawned workers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from waits import until

from hfai.agent.service import Agent
from hfai.core.config import AgentConfig, Config
from hfai.protocol import encode
from hfai.protocol.types import DesiredRun, NodeAssignment, RunAssignment, RunEventKind

# Spawned workers import torch: seconds each.
pytestmark = pytest.mark.slow

JOB = Path(__file__).parent / "jobs" / "spawn_suspend.py"
# Bounds of waits for the job (starting torch workers on two shared cores), not timings.
WAIT_S = 120.0


def _ra(tmp_path: Path, desired: DesiredRun) -> RunAssignment:
    return RunAssignment(job_id="spawned", run_id=1, name="spawned", user="u", group="default", priority=10,
                         rank=0, world_size=1, master_addr="127.0.0.1", master_port=20000,
                         entrypoint=("python", str(JOB), str(tmp_path)), workdir=str(tmp_path), desired=desired,
                         ack_window_s=60.0, kill_window_s=10.0)


def _assign(agent: Agent, ra: RunAssignment, fence: int) -> None:
    entry = SimpleNamespace(value=encode(NodeAssignment(node="n0", fence=fence, runs=(ra,))), operation=None)
    agent.assignment.on_assignment(entry)


async def _reconcile_until(agent: Agent, done, what: str) -> None:
    async def reconciled() -> bool:
        if done():
            return True
        await agent.reconcile()
        return False

    await until(reconciled, WAIT_S, what, poll=0.1)


def test_a_job_with_spawned_workers_that_acks_exits_cleanly_and_its_status_is_kept(tmp_path):
    # The agent's defaults: the grace after an ack is what this test is about.
    cfg = AgentConfig(node="n0", state_dir=str(tmp_path / "state"), env_root=str(tmp_path / "envs"),
                      gpu_source="sim", run_as="agent")
    agent = Agent(Config(agent=cfg))
    sent: list[tuple[RunEventKind, dict]] = []

    async def publish(ra, kind, **fields):
        sent.append((kind, fields))
        return True

    agent.reports.publish = publish  # type: ignore[method-assign]
    logf = agent.store.log_path("spawned", 0)

    async def scenario() -> None:
        _assign(agent, _ra(tmp_path, DesiredRun.RUN), fence=1)
        await _reconcile_until(agent, lambda: logf.exists() and logf.read_text().count(" up\n") == 2,
                               "both workers up")
        _assign(agent, _ra(tmp_path, DesiredRun.SUSPEND), fence=2)
        await _reconcile_until(agent, lambda: any(k is RunEventKind.EXITED for k, _ in sent), "the exit")

    try:
        asyncio.run(scenario())
    finally:
        for key in agent.store.snapshot():
            agent.store.signal(key, 9)
    exited = next(fields for kind, fields in sent if kind is RunEventKind.EXITED)
    text = logf.read_text()
    assert exited["exit_code"] == 0, text
    assert exited["acked"] and exited["platform_stopped"]
    assert "parent: all workers done" in text and "process exited with code 0" in text
    assert sorted(p.name for p in tmp_path.glob("share*")) == ["share0", "share1"]
    assert any(kind is RunEventKind.SUSPEND_ACKED for kind, _ in sent)
