"""Integration: controller failover, agent restart, time slicing — real processes throughout."""

from __future__ import annotations

import re
import time

import pytest
from spine_cluster import JOBS, Cluster

from hfai.protocol.types import ChainState, Priority

# Starts real clusters (nats-server, controllers, agents): excluded by `pytest -m "not slow"`.
pytestmark = pytest.mark.slow


STEPS = str(JOBS / "steps.py")


def _run_headers(log: str) -> int:
    return len(re.findall(r"^=== hfai: job .* run \d+", log, re.M))


def test_leader_killed_standby_takes_over_without_losing_or_duplicating_jobs(tmp_path):
    with Cluster(tmp_path, nodes=2, controllers=2, lease_ttl_s=2.0) as c:
        running = c.submit(["python", STEPS, "20", "0.2"], name="big", nodes=2, workdir=tmp_path)
        c.wait_state(running.id, ChainState.RUNNING)
        queued = [c.submit(["python", STEPS, "3", "0.1"], name=f"small{i}", workdir=tmp_path) for i in range(3)]
        old = c.wait(c.leader, 10, "a leader")
        c.local.kill(f"{old}")
        t0 = time.monotonic()
        c.wait(lambda: (h := c.leader()) not in (None, old) and h, 10, "the standby to take the lease", 0.05)
        took = time.monotonic() - t0
        assert took <= 2.0 + 1.0, f"takeover took {took:.2f}s"

        for job in (running, *queued):
            done = c.wait_state(job.id, ChainState.SUCCEEDED, timeout=60)
            assert done.run_id == 1 and done.suspend_count == 0, done
            for rank in range(done.spec.nodes):
                assert _run_headers(c.log(job.id, rank)) == 1


def test_agent_restart_adopts_running_job(tmp_path):
    with Cluster(tmp_path, nodes=1) as c:
        job = c.submit(["python", STEPS, "25", "0.2"], name="long", workdir=tmp_path)
        c.wait(lambda: "starts at step" in c.log(job.id), 30, "the job to start")
        pid = re.search(r"pid (\d+)", c.log(job.id)).group(1)
        c.local.kill("agent-node-0")
        time.sleep(1.0)
        c.local.start_agent(0)
        done = c.wait_state(job.id, ChainState.SUCCEEDED, timeout=60)
        assert done.run_id == 1 and done.suspend_count == 0
        log = c.log(job.id)
        assert _run_headers(log) == 1 and log.count("starts at step") == 1
        assert f"pid {pid}" in log and "finished" in log
        agent_log = (c.local.root / "logs" / "agent-node-0.log").read_text()
        assert "adopted running runs" in agent_log


def test_time_slices_let_equal_priority_jobs_of_different_users_take_turns(tmp_path):
    with Cluster(tmp_path, nodes=1, slice_s=1.5) as c:
        jobs = [c.submit(["python", STEPS, "25", "0.2"], name=f"job-{u}", user=u, workdir=tmp_path,
                         priority=Priority.NORMAL) for u in ("alice", "bob", "carol")]
        # Every job gets the node within a bounded time, while all three still have work left.
        for j in jobs:
            c.wait(lambda j=j: c.job(j.id).run_id >= 1, 45, f"{j.spec.name} to get a turn")
        assert all(not c.job(j.id).state.final for j in jobs[1:])
        finished = [c.wait_state(j.id, ChainState.SUCCEEDED, timeout=120) for j in jobs]
        assert sum(f.suspend_count for f in finished) >= 2
        assert all("time slice" in " ".join(e.reason for e in f.history) for f in finished[:1])


def test_node_that_stops_heartbeating_is_drained_and_its_job_requeued_elsewhere(tmp_path):
    import os
    import signal

    with Cluster(tmp_path, nodes=2, heartbeat_timeout_s=3.0) as c:
        job = c.submit(["python", STEPS, "30", "0.2"], name="victim-of-a-crash", workdir=tmp_path)
        first = c.wait_state(job.id, ChainState.RUNNING)
        dead = first.nodes[0]
        c.wait(lambda: "starts at step" in c.log(job.id, node=dead), 30, "the job to start")
        # The node dies: its agent and the job's processes vanish at once.
        c.local.kill(f"agent-{dead}")
        for pidfile in (c.local.root / "agents" / dead / "runs").glob("*/child_pid"):
            os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        moved = c.wait(lambda: (j := c.job(job.id)).state is ChainState.RUNNING and j.run_id == 2 and j, 30,
                       "the job to be requeued onto the other node")
        assert moved.nodes != (dead,) and moved.suspend_count == 1
        lost = [e for e in moved.history if e.state is ChainState.SUSPENDED]
        assert lost and f"node {dead} lost" in lost[0].reason
        nodes = {n.record.name: n.state.value for n in c.run(lambda api: api.nodes())}
        assert nodes[dead] == "down"
        done = c.wait_state(job.id, ChainState.SUCCEEDED, timeout=60)
        assert done.state is not ChainState.FAILED
