"""Self-fencing with real processes: the launcher stops its job's whole process group when the
agent's liveness stamp goes stale, and leaves it alone while the stamp is fresh."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from waits import wait_for_file

from hfai.agent.launcher import FENCED_FILE, LAUNCH_FILE
from hfai.agent.launchspec import Fencing, LaunchSpec
from hfai.agent.plan import RunPhase, platform_stopped
from hfai.agent.runs import RunStore
from hfai.protocol.types import DesiredRun, RunAssignment

# Starts real processes and waits out fence bounds: seconds each; `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

FENCE_S = 1.0
KILL_S = 1.5
POLL_S = 0.1
# Starting Python and the job on two shared cores: what the bound may be late by in a test.
SLACK_S = 2.0

# Ignores SIGTERM (and so does the child it leaves in its group: SIG_IGN survives exec), so only
# the KILL stops them. Writes "<its pid> <child pid>" once both run.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen(["sleep", "120"])
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.replace(sys.argv[1] + ".tmp", sys.argv[1])
while True:
    time.sleep(0.05)
"""

# Exits when asked (the default SIGTERM action).
POLITE = """
import os, sys, time
with open(sys.argv[1], "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
"""


def _stamp(path: Path, value: float | None = None) -> None:
    tmp = path.with_name("alive.tmp")
    tmp.write_text(f"{time.monotonic() if value is None else value:.6f}\n")
    os.replace(tmp, path)


def _launch(tmp_path: Path, code: str, fence_s: float | None = FENCE_S) -> tuple[subprocess.Popen, Path, Path]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logf = tmp_path / "job.log"
    logf.touch()
    pids = tmp_path / "pids"
    fence = None
    if fence_s is not None:
        fence = Fencing(alive=str(tmp_path / "alive"), fence_s=fence_s, kill_s=KILL_S * fence_s / FENCE_S,
                        poll_s=POLL_S)
    spec = LaunchSpec(argv=(sys.executable, "-c", code, str(pids)), env=dict(os.environ), cwd=str(tmp_path),
                      log=str(logf), log_cap=0, fence=fence)
    (run_dir / LAUNCH_FILE).write_bytes(spec.to_json())
    launcher = subprocess.Popen([sys.executable, "-m", "hfai.agent.launcher", str(run_dir)],
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return launcher, run_dir, pids


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def cleanup():
    launchers: list[tuple[subprocess.Popen, Path]] = []
    yield launchers
    for launcher, run_dir in launchers:
        child = run_dir / "child_pid"
        if child.exists():
            try:
                os.killpg(int(child.read_text()), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
        launcher.kill()
        launcher.wait()


def test_stale_stamp_kills_the_whole_group_within_the_bound(tmp_path, cleanup):
    alive = tmp_path / "alive"
    _stamp(alive)
    launcher, run_dir, pids = _launch(tmp_path, STUBBORN)
    cleanup.append((launcher, run_dir))
    job_pid, sleeper_pid = map(int, wait_for_file(pids).split())
    # The agent's last accepted heartbeat: from now on nobody confirms it is alive.
    _stamp(alive)
    silent_since = time.monotonic()
    launcher.wait(timeout=KILL_S + SLACK_S + 10)
    took = time.monotonic() - silent_since
    assert FENCE_S <= took <= KILL_S + SLACK_S, f"the job was stopped {took:.2f}s after the agent went silent"
    assert _gone(job_pid) and _gone(sleeper_pid), "a process of the fenced job survived"
    assert (run_dir / FENCED_FILE).exists()
    assert int((run_dir / "exit_code").read_text()) == -signal.SIGKILL  # it ignored the TERM
    assert "has not confirmed it is alive" in (tmp_path / "job.log").read_text()


def test_a_polite_job_ends_on_the_term(tmp_path, cleanup):
    alive = tmp_path / "alive"
    _stamp(alive)
    launcher, run_dir, pids = _launch(tmp_path, POLITE)
    cleanup.append((launcher, run_dir))
    int(wait_for_file(pids))
    launcher.wait(timeout=KILL_S + SLACK_S + 10)
    assert (run_dir / FENCED_FILE).exists()
    assert int((run_dir / "exit_code").read_text()) == -signal.SIGTERM


def test_fresh_stamps_leave_the_job_alone(tmp_path, cleanup):
    alive = tmp_path / "alive"
    _stamp(alive)
    launcher, run_dir, pids = _launch(tmp_path, POLITE)
    cleanup.append((launcher, run_dir))
    job_pid = int(wait_for_file(pids))
    stop = threading.Event()

    def heartbeat():  # an agent heartbeating every 0.2 s
        while not stop.wait(0.2):
            _stamp(alive)

    beats = threading.Thread(target=heartbeat)
    beats.start()
    try:
        time.sleep(3 * KILL_S)
        assert not _gone(job_pid) and launcher.poll() is None
        assert not (run_dir / FENCED_FILE).exists()
    finally:
        stop.set()
        beats.join()
    # The job ends by itself (here: the agent's own SIGTERM): an ordinary exit, not a fence.
    os.killpg(job_pid, signal.SIGTERM)
    launcher.wait(timeout=10)
    assert int((run_dir / "exit_code").read_text()) == -signal.SIGTERM
    assert not (run_dir / FENCED_FILE).exists()


def test_without_a_bound_a_stale_stamp_changes_nothing(tmp_path, cleanup):
    """Runs whose assignment carries no bound (an older leader) never fence themselves."""
    _stamp(tmp_path / "alive", time.monotonic() - 3600)
    launcher, run_dir, pids = _launch(tmp_path, POLITE, fence_s=None)
    cleanup.append((launcher, run_dir))
    job_pid = int(wait_for_file(pids))
    time.sleep(2 * KILL_S)
    assert not _gone(job_pid) and not (run_dir / FENCED_FILE).exists()


def test_the_agent_sees_a_fenced_run_as_stopped_by_the_platform(tmp_path):
    """Through RunStore, as the agent starts runs: the bound comes from the assignment, the stamp
    from mark_alive, and the snapshot of the fenced run says the platform stopped it."""
    store = RunStore(tmp_path / "state", "node-0", tmp_path / "envs", run_as="agent", fence_poll_s=POLL_S)
    store.mark_alive(time.monotonic())
    ra = RunAssignment(job_id="j1", run_id=1, name="fenced", user="tester", group="default", priority=10,
                       rank=0, world_size=1, master_addr="127.0.0.1", master_port=20001,
                       entrypoint=("python", "-c", "import time; time.sleep(120)"), workdir=str(tmp_path),
                       desired=DesiredRun.RUN, fence_s=FENCE_S)
    popen = store.start(ra)
    try:
        popen.wait(timeout=FENCE_S * 1.5 + SLACK_S + 10)
        run = store.snapshot()[ra.key]
        assert run.phase is RunPhase.EXITED and run.fenced and platform_stopped(run)
        assert run.exit_code == -signal.SIGTERM
    finally:
        if popen.poll() is None:
            store.signal(ra.key, signal.SIGKILL)
            popen.kill()
            popen.wait()
