"""A live agent that can no longer do its work stops, for systemd to restart it (issue 12).

Otherwise its assignment watch could die silently when the ``fence`` file cannot be written, while the
heartbeats go on: the node would look healthy and never run new work. So every task of the agent is
supervised and the process exits EXIT_FAILED. Tests run as root, so permission bits would not stop
a write: a directory stands where the agent writes a file."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from spine_cluster import Cluster
from waits import wait_for

from hfai.core.daemon import EXIT_FAILED

pytestmark = pytest.mark.slow

#: Generous: the agent sees the new assignment within a lease takeover (TTL 2 s), then closes.
EXIT_BOUND_S = 30.0


def _block_with_directory(path: Path, timeout: float = 10.0) -> None:
    """Put a non-empty directory where the agent keeps rewriting the file ``path``."""
    deadline = time.monotonic() + timeout
    while True:
        path.unlink(missing_ok=True)
        try:
            path.mkdir()
            break
        except FileExistsError:  # the agent wrote it again in between
            if time.monotonic() > deadline:
                raise
    (path / "blocker").write_text("")


def _wait_exit(c: Cluster, name: str, timeout: float) -> int:
    proc = c.local._procs[name]
    wait_for(lambda: proc.poll() is not None, timeout, f"{name} to exit after its state became unwritable")
    return proc.returncode


def _agent_log(c: Cluster, node: str) -> str:
    return (c.local.root / "logs" / f"agent-{node}.log").read_text()


def test_an_agent_that_cannot_save_its_fence_exits_instead_of_idling(tmp_path):
    with Cluster(tmp_path / "c", nodes=1) as c:
        state = c.local.root / "agents" / "node-0"
        c.wait(lambda: (state / "fence").is_file(), 20, "the agent to save the first leader's fence")
        _block_with_directory(state / "fence")
        # A new leader means a newer fence, which the agent must save before it acts on the first
        # assignment that carries it: the new leader writes one once there is work for the node.
        c.local.kill("controller-0", signal.SIGTERM)
        c.local.start_controller(0)
        c.wait(lambda: c.submit(["true"], name="after-takeover"), 20, "the new controller to take a job")
        assert _wait_exit(c, "agent-node-0", EXIT_BOUND_S) == EXIT_FAILED
        log = _agent_log(c, "node-0")
        assert "task assignment-watch failed" in log and "cannot save the fence" in log, log[-3000:]
        assert not list(state.glob("fence.tmp.*")), "no temp file left behind"


def test_an_agent_that_cannot_stamp_its_liveness_exits_instead_of_heartbeating(tmp_path):
    """Its heartbeats would keep the node looking alive while every launcher fenced its job."""
    with Cluster(tmp_path / "c", nodes=1) as c:
        _block_with_directory(c.local.root / "agents" / "node-0" / "alive")
        assert _wait_exit(c, "agent-node-0", EXIT_BOUND_S) == EXIT_FAILED
        log = _agent_log(c, "node-0")
        assert "task heartbeat failed" in log and "cannot stamp this agent alive" in log, log[-3000:]
