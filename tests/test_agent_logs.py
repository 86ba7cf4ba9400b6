"""The agent deletes job logs nothing has written to for log_retention_s, unless the job still has
a run on the node (real files, an Agent built without NATS)."""

from __future__ import annotations

import os
import time

from hfai.agent.service import Agent
from hfai.core.config import AgentConfig, Config
from hfai.protocol.types import DesiredRun, RunAssignment


def test_old_logs_of_jobs_without_runs_are_removed(tmp_path):
    cfg = Config(agent=AgentConfig(node="n0", state_dir=str(tmp_path), env_root=str(tmp_path / "envs"),
                                   gpu_source="sim", log_retention_s=100.0))
    agent = Agent(cfg)
    store = agent.store
    for job in ("old", "fresh", "old-but-here"):
        for rank in (0, 1):
            path = store.log_path(job, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("hello\n")
    long_ago = time.time() - 1000
    for job in ("old", "old-but-here"):
        for rank in (0, 1):
            os.utime(store.log_path(job, rank), (long_ago, long_ago))
    os.utime(store.log_path("fresh", 1), (long_ago, long_ago))  # one rank still wrote recently
    store.record_never_ran(RunAssignment(job_id="old-but-here", run_id=1, name="n", user="u", group="default",
                                         priority=10, rank=0, world_size=1, master_addr="a", master_port=1,
                                         entrypoint=("true",), workdir="/", desired=DesiredRun.RUN))

    assert agent.collect_old_logs() == ["old"]
    assert not (store.logs_dir / "old").exists()
    assert store.log_path("fresh", 0).exists() and store.log_path("old-but-here", 0).exists()
    assert agent.collect_old_logs(now=time.time() + 10_000) == ["fresh"]  # the run keeps its logs
