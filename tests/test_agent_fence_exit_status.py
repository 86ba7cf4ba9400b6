"""A run's exit status as the agent reads it from the run directory (issue 26 §2): a launcher
that wrote the job's status and exited between the agent's two looks must read as that status,
never as "killed" (-9); only a launcher gone with no status at all is one that was killed."""

from __future__ import annotations

import signal
import subprocess
import sys

import psutil
import pytest

from hfai.agent.launchers import ExecLauncher
from hfai.agent.plan import RunPhase
from hfai.agent.runs import RunStore, settle_exit
from hfai.protocol import encode
from hfai.protocol.types import DesiredRun, RunAssignment

KILLED = -signal.SIGKILL


@pytest.mark.parametrize(("first", "alive", "second", "expected"), [
    (0, False, None, (RunPhase.EXITED, 0)),  # the status was there at the first look
    (3, False, None, (RunPhase.EXITED, 3)),
    (None, True, None, (RunPhase.ALIVE, None)),  # still running
    (None, False, 0, (RunPhase.EXITED, 0)),  # written and exited between the looks: the race
    (None, False, 1, (RunPhase.EXITED, 1)),
    (None, False, None, (RunPhase.EXITED, KILLED)),  # gone without a word: killed
])
def test_settle_exit_table(first, alive, second, expected):
    assert settle_exit(first, alive, second) == expected


def _store_with_run(tmp_path) -> tuple[RunStore, str]:
    store = RunStore(tmp_path / "state", "n0", tmp_path / "envs", run_as="agent", launcher=ExecLauncher())
    ra = RunAssignment(job_id="j1", run_id=1, name="n", user="u", group="default", priority=10, rank=0,
                       world_size=1, master_addr="a", master_port=1, entrypoint=("true",), workdir="/",
                       desired=DesiredRun.RUN)
    d = store.dir(ra.key)
    d.mkdir()
    (d / "assignment").write_bytes(encode(ra))
    # A launcher that really ran and is gone: a finished process's pid and start time.
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    created = psutil.Process(proc.pid).create_time()
    proc.wait()
    (d / "launcher_pid").write_text(f"{proc.pid} {created}")
    return store, ra.key


def test_a_status_written_between_the_two_looks_is_the_runs_status(tmp_path, monkeypatch):
    """The interleaving that recorded exit-0 runs as "-9": the agent reads no status, then the
    launcher writes it and exits, then the agent finds the launcher gone. Fails on the agent
    that decided from the first read (it reported -9)."""
    store, key = _store_with_run(tmp_path)
    looks = []

    def launcher_finishes_meanwhile(d):
        (d / "exit_code").write_text("0\n")  # what launcher.py does just before it exits
        looks.append(d.name)
        return False

    monkeypatch.setattr(store, "_launcher_alive", launcher_finishes_meanwhile)
    run = store.snapshot()[key]
    assert looks == [key]
    assert (run.phase, run.exit_code) == (RunPhase.EXITED, 0)


def test_a_launcher_gone_without_a_status_reads_as_killed(tmp_path):
    store, key = _store_with_run(tmp_path)
    run = store.snapshot()[key]
    assert (run.phase, run.exit_code) == (RunPhase.EXITED, KILLED)
