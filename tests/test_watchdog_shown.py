"""The log watchdog shown (issue 35 §1, last point): each run's launcher writes its watchdog time
and when the job last wrote into the run directory; the agent's heartbeat carries it
(NodeRecord.watchdogs, protocol 1.9); the controller's status reply puts the one of the node
nearest its time on the job (JobRecord.watchdog); `hfai status` and the job page show it.
The live half is in tests/test_watchdog_live.py and tests/test_web_live.py."""

from __future__ import annotations

import os
from dataclasses import dataclass

from hfai.agent.output import Output
from hfai.agent.watchdog import WATCH_FILE, RunWatchdog, WatchdogSettings, read_watch, watchdog_spec
from hfai.cli import render
from hfai.protocol import decode, encode
from hfai.protocol.types import ChainState, JobRecord, JobSpec, NodeRecord, RunWatch, evolve, watch_of
from hfai.watchdog import WATCHDOG_FILE
from hfai.web import views


@dataclass
class _Out:
    """What RunWatchdog reads of the launcher's Output: when the job last wrote."""

    last_output: float


class _Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _watchdog(tmp_path, clock: _Clock) -> RunWatchdog:
    (tmp_path / "control").mkdir()
    spec = watchdog_spec(1800.0, str(tmp_path / "control"), WatchdogSettings(poll_s=1.0), kill_s=30.0)
    return RunWatchdog(spec, str(tmp_path), clock=clock)


def test_the_launcher_writes_the_watchdog_time_and_the_last_output_for_the_agent_to_read(tmp_path):
    clock = _Clock(1000.0)
    watch = _watchdog(tmp_path, clock)
    out = _Out(last_output=990.0)
    watch.check(out, group=-1, spare=frozenset())  # type: ignore[arg-type]
    w = read_watch(tmp_path, "j1.1", now=1000.0, ts=5e9)
    assert w == RunWatch(run="j1.1", watchdog_s=1800.0, silent_s=10.0, ts=5e9)

    # The job calls set_watchdog_time(60) and writes a line; the launcher's next look tells it.
    (tmp_path / "control" / WATCHDOG_FILE).write_text("60\n")
    out.last_output = 1000.5
    clock.t = 1001.0
    watch.check(out, group=-1, spare=frozenset())  # type: ignore[arg-type]
    w = read_watch(tmp_path, "j1.1", now=1031.0, ts=5e9)
    assert w is not None and (w.watchdog_s, w.silent_s) == (60.0, 30.5)


def test_no_watchdog_file_or_a_garbled_one_shows_nothing(tmp_path):
    assert read_watch(tmp_path, "j1.1", now=1.0, ts=1.0) is None  # a dev session's run: no launcher watchdog
    for junk in ("", "abc", "1 2 3", "nan 5", "0 5", "-3 5"):
        (tmp_path / WATCH_FILE).write_text(junk)
        assert read_watch(tmp_path, "j1.1", now=1.0, ts=1.0) is None, junk


SPEC = JobSpec(name="train", entrypoint=("python", "t.py"), workdir="/", nodes=2, priority=10, user="alice")


def _node(name: str, *watches: RunWatch) -> NodeRecord:
    return NodeRecord(name=name, group="g", address="x", ts=5e9, seq=1, watchdogs=watches)


def test_the_job_shows_the_watchdog_of_the_node_nearest_its_time():
    job = JobRecord(id="j1", spec=SPEC, state=ChainState.RUNNING, submit_ts=1.0, run_id=2, nodes=("n0", "n1"))
    records = {
        "n0": _node("n0", RunWatch(run="j1.2", watchdog_s=1800.0, silent_s=5.0, ts=5e9),
                    RunWatch(run="j9.1", watchdog_s=10.0, silent_s=9.0)),  # another job's run
        "n1": _node("n1", RunWatch(run="j1.2", watchdog_s=1800.0, silent_s=700.0, ts=5e9)),
        "n2": _node("n2", RunWatch(run="j1.2", watchdog_s=8.0, silent_s=7.0)),  # not its node now
    }
    assert watch_of(job, records) == RunWatch(run="j1.2", watchdog_s=1800.0, silent_s=700.0, ts=5e9, node="n1")
    # An earlier run's watchdog is not the current one's; a node without one, or unknown, shows nothing.
    assert watch_of(evolve(job, run_id=3), records) is None
    assert watch_of(evolve(job, nodes=("n3",)), records) is None
    # Not running: nothing, whatever a node still says.
    assert watch_of(evolve(job, state=ChainState.SUSPENDED, nodes=()), records) is None
    # On the wire (protocol 1.9) with the job and the heartbeat.
    shown = evolve(job, watchdog=watch_of(job, records))
    assert decode(encode(shown), JobRecord) == shown
    assert decode(encode(records["n0"]), NodeRecord) == records["n0"]


def test_hfai_status_and_the_job_page_show_the_watchdog_time_and_the_silence():
    job = JobRecord(id="j1", spec=SPEC, state=ChainState.RUNNING, submit_ts=1.0, run_id=1, nodes=("n0",))
    watch = RunWatch(run="j1.1", watchdog_s=1800.0, silent_s=754.2, ts=5e9, node="n0")
    text = render.job_details(evolve(job, watchdog=watch))
    line = next(x for x in text.splitlines() if x.startswith("watchdog"))
    assert "30m without output ends it as hung" in line and "silent for 12m (on n0 at " in line, line
    assert render.job_json(evolve(job, watchdog=watch))["watchdog"] == {"watchdog_s": 1800.0, "silent_s": 754.2,
                                                                       "node": "n0", "ts": 5e9}
    assert views.job_detail(evolve(job, watchdog=watch))["watchdog"]["silent_s"] == 754.2
    # Without one (a development session, a job not running): no line, null.
    assert "watchdog" not in render.job_details(job)
    assert render.job_json(job)["watchdog"] is None and views.job_detail(job)["watchdog"] is None


def test_the_silence_is_measured_on_the_clock_the_output_keeps(tmp_path):
    # The job's last output and the watchdog's "now" come from one clock (Output.clock): a
    # watchdog on a moved clock against output stamped on another would count the wrong silence.
    clock = _Clock(50.0)
    out = Output(os.open(tmp_path / "job.log", os.O_RDWR | os.O_CREAT, 0o600), 0, clock=clock)
    try:
        out.job_started()
        watch = _watchdog(tmp_path, clock)
        clock.t = 50.0 + 1799.0
        watch.check(out, group=-1, spare=frozenset())
        assert watch.hung_at is None
        w = read_watch(tmp_path, "j1.1", now=clock.t, ts=5e9)
        assert w is not None and w.silent_s == 1799.0
    finally:
        out.close()
