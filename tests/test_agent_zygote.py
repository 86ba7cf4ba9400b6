"""Launchers forked from the zygote (agent/zygote.py) keep what an exec'd launcher guarantees: a
session of their own, the exit status in the run directory, independence from the zygote; and a
dead zygote costs nothing but a restart. Real processes."""

from __future__ import annotations

import os
import signal
import sys

import psutil
import pytest
from waits import wait_for

from hfai.agent import zygote
from hfai.agent.launchers import ExecLauncher, ZygoteLauncher
from hfai.agent.plan import RunPhase
from hfai.agent.runs import RunStore
from hfai.protocol.types import DesiredRun, RunAssignment

pytestmark = pytest.mark.slow

WAIT_S = 30.0  # a bound on waits for short jobs on two shared cores, not a timing


def _ra(tmp_path, job_id: str, code: str) -> RunAssignment:
    return RunAssignment(job_id=job_id, run_id=1, name=job_id, user="u", group="default", priority=10, rank=0,
                         world_size=1, master_addr="127.0.0.1", master_port=20000,
                         entrypoint=("python", "-c", code), workdir=str(tmp_path), desired=DesiredRun.RUN)


def _exit_code(store: RunStore, key: str) -> int | None:
    run = wait_for(lambda: (r := store.snapshot()[key]).phase is not RunPhase.ALIVE and r, WAIT_S, f"{key} to end",
                   poll=0.05)
    return run.exit_code


def test_a_forked_launcher_is_a_session_leader_and_records_the_exit(tmp_path):
    store = RunStore(tmp_path / "state", "n0", tmp_path / "envs", run_as="agent")
    launched = store.start(_ra(tmp_path, "forked", "import time, sys; time.sleep(1); sys.exit(7)"))
    proc = psutil.Process(launched.pid)
    assert proc.cmdline()[-1] == "hfai.agent.zygote"  # forked, not a new interpreter
    assert os.getsid(launched.pid) == launched.pid and proc.ppid() != os.getpid()
    assert _exit_code(store, "forked.1") == 7
    launched.wait(WAIT_S)


def test_runs_outlive_their_zygote_and_a_dead_zygote_is_replaced(tmp_path):
    store = RunStore(tmp_path / "state", "n0", tmp_path / "envs", run_as="agent")
    first = store.start(_ra(tmp_path, "first", "import time; time.sleep(2)"))
    z = zygote.shared()
    assert z._proc is not None
    old = z._proc.pid
    os.kill(old, signal.SIGKILL)  # as when its agent is killed and the pipe closes, only harder
    z._proc.wait()
    second = store.start(_ra(tmp_path, "second", "pass"))  # a fault, then a fresh zygote or an exec
    assert _exit_code(store, "second.1") == 0
    assert _exit_code(store, "first.1") == 0  # its launcher did not need the zygote
    first.wait(WAIT_S)
    second.wait(WAIT_S)
    third = store.start(_ra(tmp_path, "third", "pass"))
    assert z._proc is not None and z._proc.pid != old and psutil.Process(third.pid).ppid() == z._proc.pid
    assert _exit_code(store, "third.1") == 0


def test_the_agent_starts_its_zygote_before_the_first_run_which_the_zygote_forks(tmp_path):
    """warm() (the agent calls it as it starts: agent/service.py) starts the zygote at once, so that
    its interpreter and imports are not on the node's first run, nor compete with later runs;
    twice changes nothing, and a zygote found dead is started again."""
    z = zygote.Zygote()
    launcher = ZygoteLauncher(source=z)
    try:
        launcher.warm()
        proc = z._proc
        assert proc is not None and proc.poll() is None
        launcher.warm()
        assert z._proc is proc
        store = RunStore(tmp_path / "state", "n0", tmp_path / "envs", run_as="agent", launcher=launcher)
        launched = store.start(_ra(tmp_path, "warm", "pass"))
        assert psutil.Process(launched.pid).ppid() == proc.pid
        assert _exit_code(store, "warm.1") == 0
        proc.kill()
        proc.wait()
        launcher.warm()
        assert z._proc is not None and z._proc is not proc and z._proc.poll() is None
    finally:
        z.close()
    assert ExecLauncher().warm() is None  # nothing to make ready


def test_exec_launchers_remain_available(tmp_path):
    store = RunStore(tmp_path / "state", "n0", tmp_path / "envs", run_as="agent", launcher=ExecLauncher())
    launched = store.start(_ra(tmp_path, "execd", "import sys; sys.exit(3)"))
    assert _exit_code(store, "execd.1") == 3
    assert psutil.Process(os.getpid()).pid != launched.pid and sys.executable


def test_a_forked_launcher_hands_its_fsyncs_to_the_zygote(tmp_path, monkeypatch):
    """A launcher's last fsyncs (its exit status and assignment, off its run's path: launcher.py)
    go to the zygote's thread through the pipe it inherited, rather than to a forked child (a
    copy of its page tables and of every page it then writes, and an exit, for two fsyncs)."""
    from hfai.agent import launcher

    sync_r, sync_w = os.pipe2(os.O_CLOEXEC)
    os.set_blocking(sync_w, False)
    paths = [str(tmp_path / "exit_code"), str(tmp_path / "assignment")]
    for p in paths:
        open(p, "w").close()

    def no_fork() -> int:
        raise AssertionError("forked a child to fsync")

    monkeypatch.setattr(os, "fork", no_fork)
    launcher._persist_after_exit(paths, sync_w)
    synced: list[list[str]] = []
    monkeypatch.setattr(launcher, "_fsync_all", synced.append)
    rest = bytearray()
    assert zygote._sync_handed(sync_r, rest) and synced == [paths]
    os.write(sync_w, b"/a\0/b")  # a line cut by a read: synced once it is whole
    assert zygote._sync_handed(sync_r, rest) and synced == [paths]
    os.write(sync_w, b"c\n")
    assert zygote._sync_handed(sync_r, rest) and synced == [paths, ["/a", "/bc"]]
    os.close(sync_w)
    assert not zygote._sync_handed(sync_r, rest)  # the pipe's end: the thread stops
    os.close(sync_r)


def test_a_launcher_whose_zygote_is_gone_fsyncs_all_the_same(tmp_path, monkeypatch):
    from hfai.agent import launcher

    sync_r, sync_w = os.pipe2(os.O_CLOEXEC)
    os.close(sync_r)  # the zygote ended: a write meets EPIPE
    synced: list[list[str]] = []
    monkeypatch.setattr(launcher, "_fsync_all", synced.append)

    def cannot_fork() -> int:
        raise OSError("no fork here")  # the last resort: synced in the launcher itself

    monkeypatch.setattr(os, "fork", cannot_fork)
    launcher._persist_after_exit([str(tmp_path / "exit_code")], sync_w)
    assert synced == [[str(tmp_path / "exit_code")]]
    os.close(sync_w)


def test_a_forked_launcher_becomes_a_subreaper_with_the_prctl_found_before_the_fork(monkeypatch):
    # A CDLL made in each launcher built a class and a function pointer there, whose objects
    # copied pages from the zygote on every run's path; the launcher module finds prctl once, at
    # import (in the zygote), and a launcher only calls it.
    import ctypes

    from hfai.agent import launcher

    prctl = launcher._PRCTL
    assert prctl is not None  # Linux

    def refuse(*_a, **_k):
        raise AssertionError("a CDLL made in the launcher")

    monkeypatch.setattr(ctypes, "CDLL", refuse)
    pid = os.fork()
    if pid == 0:  # the launcher's part, in a child: this test process must not become a subreaper
        code = 3
        try:
            launcher._become_subreaper()
            flag = ctypes.c_int(0)
            prctl(37, ctypes.byref(flag), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER
            code = 0 if flag.value == 1 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
