"""How a launcher finds the container's pid 1, whose process group the platform signals
(agent/launcher.py::_container_init): bwrap's monitor names it on --info-fd as it makes it, and the
launcher waits for its session (``--new-session``) with a system call, rather than looking for it
in /proc every millisecond. Real bwrap where it works here; the pipe's edge cases without."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from waits import wait_for

from hfai.agent import launcher
from hfai.agent.sandbox import ContainerPaths, bwrap_args, find_bwrap, plan_mounts, probe, signal_status

WAIT_S = 30.0  # a bound on waits on two shared cores, not a timing


@pytest.fixture(scope="module")
def bwrap() -> str:
    path = find_bwrap()
    why = probe(path)
    if why:
        pytest.skip(why)
    assert path is not None
    return path


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def test_the_launcher_gets_pid_1_from_bwrap_and_signals_reach_the_job(bwrap, tmp_path):
    c = ContainerPaths(user="probe", workdir=str(tmp_path), control_dir=str(tmp_path)).with_host()
    r, w = os.pipe2(os.O_CLOEXEC)
    child = subprocess.Popen([bwrap, "--info-fd", str(w), *bwrap_args(c, plan_mounts(c)), "--", "sleep", "60"],
                             pass_fds=(w,), start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        init = launcher._container_init(child, r, w)
        assert init != child.pid and os.getsid(init) == init  # pid 1, its session made
        assert _children(child.pid) == [init]  # bwrap's monitor -> pid 1
        (job,) = wait_for(lambda: _children(init), WAIT_S, "pid 1 to start the job", poll=0.01)
        assert os.getpgid(job) == init  # the job is in pid 1's group: a signal to it reaches the job
        os.killpg(init, signal.SIGTERM)
        assert signal_status(child.wait(WAIT_S)) == -signal.SIGTERM
        with pytest.raises(OSError):
            os.fstat(r)  # read to its end and closed
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_pid_1_from_bwraps_info():
    r, w = os.pipe()
    os.write(w, json.dumps({"child-pid": 4242, "cgroup-namespace": 1}).encode())
    os.close(w)
    assert launcher._read_init(r, time.monotonic() + WAIT_S) == (4242, True)
    os.close(r)
    r, w = os.pipe()
    os.write(w, b"bwrap: something went wrong")
    os.close(w)
    assert launcher._read_init(r, time.monotonic() + WAIT_S) == (None, True)
    os.close(r)


def test_a_monitor_that_has_not_written_keeps_its_pipe_and_the_launcher_falls_back_to_bwrap(monkeypatch):
    """Past the launcher's patience (a host too busy to run bwrap for seconds) the fallback is bwrap
    itself (signalling it ends the container); the pipe's read end stays open, as bwrap gives up
    the container when its write finds no reader."""
    monkeypatch.setattr(launcher, "CONTAINER_FIND_S", 0.2)
    r, w = os.pipe2(os.O_CLOEXEC)
    child = subprocess.Popen(["sleep", "60"], pass_fds=(w,), stdin=subprocess.DEVNULL)
    try:
        assert launcher._container_init(child, r, w) == child.pid
        os.fstat(r)  # still open
        with pytest.raises(OSError):
            os.fstat(w)  # the launcher's copy of the write end went at once
    finally:
        child.kill()
        child.wait()
        os.close(r)
