"""Issue 11 defect 2, live: a dead agent must not mean a duplicate job.

An agent killed with SIGKILL leaves its job running (its launcher is in a session of its own).
The leader requeues the job after heartbeat_timeout_s and restarts it on the other node; the
orphan must be dead by then (self-fencing), so the shared progress file shows every line of the
first run before the first line of the second.
"""

from __future__ import annotations

import signal
import time

import pytest
from spine_cluster import JOBS, TEST_CONTROLLER, Cluster

from hfai.agent.launcher import FENCED_FILE
from hfai.protocol.types import ChainState

APPENDER = str(JOBS / "appender.py")


def _lines(path) -> list[tuple[int, int, float]]:
    """(writer: the run id, step, time) per line of the progress file."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        pid, step, ts = line.split()
        out.append((int(pid), int(step), float(ts)))
    return out


@pytest.mark.slow
def test_killed_agent_orphan_is_fenced_before_the_job_restarts_elsewhere(tmp_path):
    timeout_s = TEST_CONTROLLER.heartbeat_timeout_s  # 8 s: runs fence at 4.8 s, are dead by 6.4 s
    progress = tmp_path / "progress.txt"
    started = time.monotonic()
    with Cluster(tmp_path, nodes=2) as c:
        job = c.submit(["python", APPENDER, str(progress), "120", "0.1"], name="fenced", workdir=tmp_path)
        first = c.wait_state(job.id, ChainState.RUNNING, timeout=30)
        dead = first.nodes[0]
        c.wait(lambda: len(_lines(progress)) >= 5, 30, "the first run to make progress")
        first_pid = _lines(progress)[0][0]

        c.local.kill(f"agent-{dead}", signal.SIGKILL)
        killed_at = time.time()
        moved = c.wait(lambda: (j := c.job(job.id)).state is ChainState.RUNNING and j.run_id == 2 and j, 30,
                       "the job to be restarted on the other node")
        assert moved.nodes != (dead,) and moved.suspend_count == 1
        assert any(f"node {dead} lost" in e.reason for e in moved.history)
        c.wait(lambda: sum(p != first_pid for p, _, _ in _lines(progress)) >= 5, 30, "the second run to make progress")

        lines = _lines(progress)
        pids = [p for p, _, _ in lines]
        last_first = max(i for i, p in enumerate(pids) if p == first_pid)
        first_second = min(i for i, p in enumerate(pids) if p != first_pid)
        assert last_first < first_second, \
            f"the two runs wrote at the same time: {lines[first_second - 3:first_second + 9]}"
        # ... and not merely in file order: the orphan was dead, by the wall clock, before the
        # new run began, and it stopped within the fence bound after its agent died.
        assert lines[last_first][2] < lines[first_second][2]
        assert lines[last_first][2] - killed_at < 0.8 * timeout_s + 0.5
        # The second run resumed from the first's checkpoint, not from the start.
        assert lines[first_second][1] > 0

        run_dir = c.local.root / "agents" / dead / "runs" / f"{job.id}.1"
        assert (run_dir / FENCED_FILE).exists() and (run_dir / "exit_code").exists()
        assert "has not confirmed it is alive" in c.log(job.id, node=dead)

        # The agent comes back: it reports the stale run's exit (ignored: run 2 holds the job),
        # cleans up, and the job finishes on the other node, never counted as failed.
        c.local.start_agent(int(dead.rsplit("-", 1)[1]))
        done = c.wait_state(job.id, ChainState.SUCCEEDED, timeout=40)
        assert done.run_id == 2
        c.wait(lambda: not run_dir.exists(), 15, "the returned agent to clean up the fenced run")
    assert time.monotonic() - started < 60
