"""The log watchdog (agent/watchdog.py): the verdict and the run's watchdog time as pure functions,
what the controller makes of a hung run, ``hfai.set_watchdog_time`` and ``import hfai`` in a job,
and a real launcher ending a silent job with its stacks in the log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waits import wait_for

import hfai.watchdog as runtime_watchdog
from hfai.agent.launcher import LAUNCH_FILE
from hfai.agent.launchspec import LaunchSpec, WatchSpec
from hfai.agent.output import Output
from hfai.agent.runs import RunStore
from hfai.agent.watchdog import (
    HUNG_FILE,
    Verdict,
    WatchdogSettings,
    catches,
    dump_stacks,
    parse_seconds,
    run_watchdog_s,
    verdict,
)
from hfai.controller import transitions as tr
from hfai.controller.policy import Start
from hfai.protocol.reasons import ReasonCode
from hfai.protocol.types import (
    JOB_DEV,
    ChainState,
    DesiredRun,
    JobRecord,
    JobSpec,
    RunAssignment,
    RunEvent,
    RunEventKind,
    evolve,
)
from hfai.watchdog import STACK_SIGNAL, WATCHDOG_FILE

# ------------------------------------------------------------------------------------- pure


def test_a_run_is_hung_once_silent_for_its_watchdog_time_and_killed_a_grace_later():
    assert verdict(now=107.9, last_output=100.0, watchdog_s=8.0, hung_at=None, kill_s=3.0) is Verdict.NONE
    assert verdict(now=108.0, last_output=100.0, watchdog_s=8.0, hung_at=None, kill_s=3.0) is Verdict.HUNG
    assert verdict(now=108.0, last_output=101.0, watchdog_s=8.0, hung_at=None, kill_s=3.0) is Verdict.NONE
    # Found hung: later output does not take it back; SIGKILL once the grace is over.
    assert verdict(now=110.0, last_output=109.5, watchdog_s=8.0, hung_at=108.0, kill_s=3.0) is Verdict.NONE
    assert verdict(now=111.0, last_output=109.5, watchdog_s=8.0, hung_at=108.0, kill_s=3.0) is Verdict.KILL
    assert verdict(now=1e9, last_output=0.0, watchdog_s=0.0, hung_at=None, kill_s=3.0) is Verdict.NONE  # none


def test_the_watchdog_time_of_a_run():
    assert run_watchdog_s({}, dev=False, default_s=1800.0) == 1800.0
    assert run_watchdog_s({"HF_WATCHDOG_TIME": "21600"}, dev=False, default_s=1800.0) == 21600.0
    assert run_watchdog_s({"HF_WATCHDOG_TIME": "21600"}, dev=True, default_s=1800.0) == 0.0  # a dev session
    assert run_watchdog_s({"HF_WATCHDOG_TIME": "soon"}, dev=False, default_s=1800.0) == 1800.0
    assert run_watchdog_s({}, dev=False, default_s=0.0) == 0.0  # off by default, and the job asked nothing
    assert run_watchdog_s({"HF_WATCHDOG_TIME": "60"}, dev=False, default_s=0.0) == 60.0
    for raw in (None, b"", b"0", b"-5", b"nan", b"inf", b"\xff", "x"):
        assert parse_seconds(raw) is None, raw
    assert parse_seconds(b"8\n") == 8.0 and parse_seconds("0.5") == 0.5


# ------------------------------------------------------------------------------- controller

SPEC = JobSpec(name="j", entrypoint=("python", "t.py"), workdir="/w", nodes=2, user="alice")


def _running(**spec) -> JobRecord:
    j = JobRecord(id="j1", spec=evolve(SPEC, **spec), state=ChainState.QUEUED, submit_ts=1.0)
    return tr.apply_start(j, Start("j1", ("n0", "n1")), 2.0, "10.0.0.1", 20000)


def _exited(node: str, code: int, run: int = 1, hung_s: float = 0.0, stopped: bool = False) -> RunEvent:
    return RunEvent(event=RunEventKind.EXITED, node=node, job_id="j1", run_id=run, ts=5.0, exit_code=code,
                    hung_s=hung_s, platform_stopped=stopped)


def test_a_hung_run_fails_the_job_with_a_reason_that_names_the_silence():
    j = tr.apply_event(_running(), _exited("n1", -15, hung_s=1800.0), 6.0)
    assert j.state is ChainState.FAILED
    assert j.why.code == ReasonCode.HUNG and j.why.params["node"] == "n1"
    assert j.reason == "hung: no output for 30 min on rank 1 (n1); stacks in the log"


def test_restart_on_hang_requeues_at_most_n_times_then_fails():
    j = _running(restart_on_hang=1)
    j = tr.apply_event(j, _exited("n0", -15, hung_s=8.0), 6.0)
    assert j.state is ChainState.SUSPENDING and j.hang_restarts == 1  # the other rank stops first
    assert j.reason == "hung: no output for 8 s on rank 0 (n0); stacks in the log; restart 1 of 1"
    j = tr.apply_event(j, _exited("n1", -15), 7.0)
    assert j.state is ChainState.SUSPENDED and j.retried == 0
    j = tr.apply_start(j, Start("j1", ("n1", "n0")), 8.0, "10.0.0.1", 20000)
    j = tr.apply_event(j, _exited("n1", -15, run=2, hung_s=8.0), 9.0)
    assert j.state is ChainState.FAILED and j.why.code == ReasonCode.HUNG and "restart" not in j.reason


def test_the_platforms_own_stop_outranks_a_hang_and_a_retry_is_not_spent_on_one():
    # Fenced (or a GPU fault) while silent: the platform's interruption, requeued as ever.
    j = tr.apply_event(_running(), _exited("n0", -15, hung_s=8.0, stopped=True), 6.0)
    assert j.state is ChainState.SUSPENDING and j.why.code == ReasonCode.PLATFORM_STOPPED
    j = tr.apply_event(_running(retries=3), _exited("n0", -15, hung_s=8.0), 6.0)
    assert j.state is ChainState.FAILED and j.retried == 0 and j.why.code == ReasonCode.HUNG


# ---------------------------------------------------------------------------- in the job


def test_set_watchdog_time_reaches_the_runs_control_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HFAI_CONTROL_DIR", str(tmp_path))
    import hfai

    hfai.set_watchdog_time(8)
    assert (tmp_path / WATCHDOG_FILE).read_text() == "8\n" and os.environ["HFAI_WATCHDOG_TIME"] == "8"
    hfai.client.set_watchdog_time(21600)
    assert (tmp_path / WATCHDOG_FILE).read_text() == "21600\n"
    for bad in (0, -1, 1.5, True, "8"):
        with pytest.raises((TypeError, ValueError)):
            runtime_watchdog.set_watchdog_time(bad)  # type: ignore[arg-type]
    assert (tmp_path / WATCHDOG_FILE).read_text() == "21600\n"


def _handles_stack_signal(env: dict[str, str]) -> bool:
    code = f"import os, hfai; from hfai.agent.watchdog import catches; print(catches(os.getpid(), {int(STACK_SIGNAL)}))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def test_import_hfai_in_a_job_writes_its_stacks_on_a_signal_and_nowhere_else(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HFAI_CONTROL_DIR"}
    assert not _handles_stack_signal(env)  # a CLI command, a script off the platform
    assert _handles_stack_signal({**env, "HFAI_CONTROL_DIR": str(tmp_path)})


# ------------------------------------------------------------------------- real processes

# Goes silent in a named function once it set its watchdog time through the control directory.
SILENT = """
import sys, time
import hfai
hfai.set_watchdog_time(int(sys.argv[1]))
print("going quiet", flush=True)

def stuck_in_a_silent_wait():
    time.sleep(120)

stuck_in_a_silent_wait()
"""

# Writes a line every 0.2 s for 3 s: never silent for its 1 s watchdog time.
CHATTY = """
import time
for i in range(15):
    print(i, flush=True)
    time.sleep(0.2)
"""


def _launch(tmp_path: Path, code: str, args: list[str], watchdog_s: float) -> tuple[subprocess.Popen, Path, Path]:
    run_dir, control = tmp_path / "run", tmp_path / "control"
    run_dir.mkdir()
    control.mkdir()
    logf = tmp_path / "job.log"
    logf.touch()
    spec = LaunchSpec(argv=(sys.executable, "-c", code, *args), env={**os.environ, "HFAI_CONTROL_DIR": str(control)},
                      cwd=str(tmp_path), log=str(logf), log_cap=0,
                      watchdog=WatchSpec(watchdog_s=watchdog_s, control=str(control), poll_s=0.1, dump_s=10.0,
                                         kill_s=2.0))
    (run_dir / LAUNCH_FILE).write_bytes(spec.to_json())
    launcher = subprocess.Popen([sys.executable, "-m", "hfai.agent.launcher", str(run_dir)],
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return launcher, run_dir, logf


@pytest.mark.slow
def test_a_silent_job_is_ended_as_hung_with_the_function_it_sleeps_in_in_its_log(tmp_path):
    # The spec's time is an hour: the job's own set_watchdog_time(1) is what ends it.
    launcher, run_dir, logf = _launch(tmp_path, SILENT, ["1"], watchdog_s=3600.0)
    try:
        assert launcher.wait(timeout=60) == 0
    finally:
        launcher.kill()
    log = logf.read_text()
    assert "going quiet" in log and "=== hfai: no output for" in log and "stopped as hung" in log, log
    assert "stuck_in_a_silent_wait" in log, log  # py-spy's stack of the job
    watchdog_s, silent_s = map(float, (run_dir / HUNG_FILE).read_text().split())
    assert watchdog_s == 1.0 and silent_s >= 1.0
    assert int((run_dir / "exit_code").read_text()) == -signal.SIGTERM


@pytest.mark.slow
def test_output_keeps_a_job_alive_past_its_watchdog_time(tmp_path):
    launcher, run_dir, logf = _launch(tmp_path, CHATTY, [], watchdog_s=1.0)
    try:
        assert launcher.wait(timeout=60) == 0
    finally:
        launcher.kill()
    assert int((run_dir / "exit_code").read_text()) == 0, logf.read_text()
    assert not (run_dir / HUNG_FILE).exists()


# Registers faulthandler as `import hfai` does in a job, says so, and waits in a named function.
REGISTERED = """
import time
import hfai.watchdog
hfai.watchdog.register_stack_dump()
print("ready", flush=True)

def waits_for_a_peer_that_never_comes():
    time.sleep(120)

waits_for_a_peer_that_never_comes()
"""


@pytest.mark.slow
def test_without_py_spy_a_process_that_registered_faulthandler_writes_its_own_stacks(tmp_path):
    logf = tmp_path / "job.log"
    fd = os.open(logf, os.O_RDWR | os.O_CREAT, 0o600)
    out = Output(fd, 0)
    plain = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdout=out.job_fd,
                             stderr=subprocess.STDOUT)
    job = subprocess.Popen([sys.executable, "-c", REGISTERED], stdout=out.job_fd, stderr=subprocess.STDOUT)
    out.job_started()
    try:
        def ready() -> bool:
            out.pump()
            return b"ready" in logf.read_bytes() and catches(job.pid, STACK_SIGNAL)

        wait_for(ready, 30, "the job to register faulthandler", poll=0.05)
        dump_stacks([plain.pid, job.pid], out, deadline=float("inf"), py_spy=None)
        log = logf.read_text()
        assert "waits_for_a_peer_that_never_comes" in log, log
        # One that did not register it is not sent a signal it would die of: it is only named.
        assert f"pid {plain.pid}" in log and plain.poll() is None
    finally:
        for p in (plain, job):
            p.kill()
            p.wait()
        out.close()


def _assignment(kind: str) -> RunAssignment:
    return RunAssignment(job_id="j1", run_id=1, name="n", user="u", group="default", priority=10, rank=0,
                         world_size=1, master_addr="a", master_port=1, entrypoint=("sleep", "2"), workdir="/",
                         desired=DesiredRun.RUN, kind=kind)


@pytest.mark.slow
def test_a_development_session_has_no_watchdog(tmp_path):
    store = RunStore(tmp_path / "state", "n0", tmp_path / "envs", run_as="agent",
                     watchdog=WatchdogSettings(default_s=0.5, poll_s=0.1))
    for kind in ("batch", JOB_DEV):
        ra = evolve(_assignment(kind), job_id=f"j{kind}")
        store.start(ra)
        spec = LaunchSpec.from_json((store.dir(ra.key) / LAUNCH_FILE).read_bytes())
        assert (spec.watchdog is not None) is (kind != JOB_DEV), spec
    # The silent session outlives the watchdog time a batch job had (0.5 s): it exits 0.
    dev = f"j{JOB_DEV}.1"
    run = wait_for(lambda: (r := store.snapshot()[dev]).exit_code is not None and r, 30, "the session to end")
    assert run.exit_code == 0 and run.hung_s == 0.0
    batch = wait_for(lambda: (r := store.snapshot()["jbatch.1"]).exit_code is not None and r, 30, "the job to end")
    assert batch.hung_s == 0.5 and batch.exit_code != 0
