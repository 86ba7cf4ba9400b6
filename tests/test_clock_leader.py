"""Issue 38 §4: a leader whose wall clock is skewed neither stops jobs early nor forgets finished
ones. Time limits and the run time a requeue adds are measured on the replica's monotonic clock
(controller/runclock.py); finished jobs' ages are judged on the NATS server's clock, and not at all
while this host's disagrees with it (controller/clockcheck.py). The leader runs on a FakeClock
against an in-memory KV; the clock check measures against a real nats-server."""

from __future__ import annotations

import asyncio
import time

import nats
import pytest
from fakes import FakeElection, FakeKV, FakeMsg

from hfai.controller import transitions as tr
from hfai.controller.clockcheck import ClockWatch, measure
from hfai.controller.leader import Leader
from hfai.controller.nodes import NodeTracker
from hfai.controller.policy import Start, Suspend
from hfai.controller.runclock import RunClock, recount
from hfai.controller.store_health import health_bucket
from hfai.core.clock import FakeClock
from hfai.core.config import Config
from hfai.kv import KVCache
from hfai.protocol import decode, encode, names, reasons
from hfai.protocol.types import ChainState, JobRecord, JobSpec, NodeRecord, RunEvent, RunEventKind

HOUR, DAY = 3600.0, 86400.0
SKEW_S = 2 * HOUR  # how far this leader's wall clock is ahead of the host's that started the run


def _job(job_id: str = "j1", time_limit_s: float = HOUR) -> JobRecord:
    spec = JobSpec(name="train", entrypoint=("python", "t.py"), workdir="/w", nodes=1, user="bob",
                   time_limit_s=time_limit_s)
    return JobRecord(id=job_id, spec=spec, state=ChainState.QUEUED, submit_ts=1.0, reason="queued")


def _started_elsewhere(clock: FakeClock, ago_s: float) -> JobRecord:
    """A job a leader with a right clock started ``ago_s`` ago, as this skewed leader reads it."""
    return tr.apply_start(_job(), Start("j1", ("n0",)), clock.time() - SKEW_S - ago_s, "10.0.0.1", 20000)


async def _leader(clock: FakeClock, *records: JobRecord) -> tuple[Leader, FakeKV]:
    kv = FakeKV()
    jobs = KVCache(kv, JobRecord)  # fed here: the fake bucket has no watch
    for r in records:
        jobs.put_local(r.id, r, kv._put(r.id, encode(r)))
    # No node records, and a heartbeat timeout long enough that n0 is never taken for lost.
    nodes = NodeTracker(KVCache(FakeKV(), NodeRecord), 10 * DAY)
    leader = Leader(Config(), None, kv, None, jobs, nodes, FakeElection(), asyncio.Event(), clock=clock)
    return leader, kv


async def _record(kv: FakeKV, job_id: str = "j1") -> JobRecord:
    return decode((await kv.get(job_id)).value, JobRecord)


async def test_a_leader_ahead_by_two_hours_does_not_stop_a_job_5s_into_its_hour():
    clock = FakeClock()
    leader, kv = await _leader(clock, _started_elsewhere(clock, ago_s=5.0))
    await leader._plan_round()
    assert (await _record(kv)).state is ChainState.RUNNING, (await _record(kv)).reason
    await clock.advance(HOUR - 60.0)
    await leader._plan_round()
    assert (await _record(kv)).state is ChainState.RUNNING, "stopped before its hour was up"
    await clock.advance(61.0)
    await leader._plan_round()
    stopped = await _record(kv)
    assert stopped.state is ChainState.STOPPING and "time limit" in stopped.reason
    assert "ran 1:00:01" in stopped.reason  # this leader's measure, not 3:00:01 of wall stamps


async def test_a_requeue_adds_the_run_time_measured_not_the_wall_stamps_difference():
    clock = FakeClock()
    job = tr.apply_suspend(_started_elsewhere(clock, ago_s=0.0), _suspend(), clock.time())
    leader, kv = await _leader(clock, job)
    await leader._plan_round()  # its first sight of the run (a replica's copy of the bucket feeds it sooner)
    await clock.advance(90.0)
    ev = RunEvent(event=RunEventKind.EXITED, node="n0", job_id="j1", run_id=1, ts=clock.time(), exit_code=-15,
                  acked=True, platform_stopped=True)
    await leader._handle_event(FakeMsg(names.event_subject("n0"), ev))
    requeued = await _record(kv)
    assert requeued.state is ChainState.SUSPENDED
    assert requeued.run_s == pytest.approx(90.0), "run_s took the wall stamps' difference across hosts"


def _suspend() -> Suspend:
    return Suspend("j1", reasons.preempting(), for_job="")


def _done(clock: FakeClock, job_id: str, ended_ago_s: float) -> JobRecord:
    job = tr.apply_start(_job(job_id), Start(job_id, ("n0",)), clock.time() - ended_ago_s - 60.0, "10.0.0.1", 20000)
    ev = RunEvent(event=RunEventKind.EXITED, node="n0", job_id=job_id, run_id=1, ts=0.0, exit_code=0)
    done = tr.apply_event(job, ev, clock.time() - ended_ago_s)
    assert done.state is ChainState.SUCCEEDED
    return done


async def test_a_leader_whose_clock_disagrees_with_the_nats_servers_forgets_nothing():
    """31 days ahead: the job that finished a minute ago looks 31 days old to it. With the clock
    check's measurement it forgets nothing; once the clocks agree, what is old by the server's
    clock goes, and nothing else."""
    clock = FakeClock()
    ahead = 31 * DAY
    clock.wall_offset += ahead  # the records were stamped before this host's clock jumped
    leader, kv = await _leader(clock, _done(clock, "recent", ahead + 60.0), _done(clock, "old", ahead + 40 * DAY))
    leader.clock_watch = watch = ClockWatch(alarm_s=5.0, fresh_s=90.0)
    watch.observe(ahead, 0.01, clock.monotonic())
    await leader._forget_finished()
    assert set(kv.messages) >= {"recent", "old"} and all(kv.messages[k].op is None for k in ("recent", "old"))

    clock.wall_offset -= ahead  # set right (NTP)
    watch.observe(0.2, 0.01, clock.monotonic())
    await leader._forget_finished()
    assert kv.messages["recent"].op is None, "the job that finished a minute ago was forgotten"
    assert kv.messages["old"].op == "PURGE"


async def test_retention_waits_for_a_fresh_check_of_the_clock():
    clock = FakeClock()
    leader, kv = await _leader(clock, _done(clock, "old", 40 * DAY))
    leader.clock_watch = watch = ClockWatch(alarm_s=5.0, fresh_s=90.0)
    await leader._forget_finished()
    assert kv.messages["old"].op is None, "forgotten before this host's clock was ever checked"
    watch.observe(0.1, 0.01, clock.monotonic())
    await clock.advance(91.0)
    await leader._forget_finished()
    assert kv.messages["old"].op is None, "forgotten on a stale check"
    watch.observe(0.1, 0.01, clock.monotonic())
    await leader._forget_finished()
    assert kv.messages["old"].op == "PURGE"


# ------------------------------------------------------------------------------ pure parts


def test_the_run_clock_counts_on_the_monotonic_clock_from_its_first_sight():
    clock = FakeClock()
    rc = RunClock(clock)
    job = _started_elsewhere(clock, ago_s=0.0)
    rc.observe(job.id, job)
    clock.now += 30.0
    clock.wall_offset += 2 * HOUR  # stepped: the run is still 30 s old
    assert rc.ran(job) == 30.0
    again = tr.requeue(job, clock.time(), "requeued")
    rc.observe(job.id, again)
    assert rc.ran(again) == 0.0 and again.run_s > HOUR  # the pure transition's wall difference ...
    assert recount(job, again, rc) is not None
    rc.observe(job.id, job)
    clock.now += 12.0
    assert recount(job, again, rc).run_s == 12.0  # ... which the leader's recount replaces


def test_a_run_older_than_the_replica_is_counted_from_its_stamp_on_the_servers_clock():
    """A replica that started while the run ran saw it only in the bucket's first snapshot: the
    wall stamp it has, corrected by this host's measured offset to the NATS server's clock. Until
    the offset is measured it counts from its own first sight: never long enough to stop a job
    early on an unmeasured clock."""
    clock = FakeClock()
    live, offset = False, None
    rc = RunClock(clock, live=lambda: live, offset=lambda: offset)
    job = _started_elsewhere(clock, ago_s=600.0)  # by a host on the server's time
    rc.observe(job.id, job)
    live = True
    clock.now += 5.0
    assert rc.ran(job) == 5.0  # unmeasured: this replica's own sight (the wall stamps say 2:10:05)
    offset = SKEW_S
    clock.now += 5.0
    assert rc.ran(job) == pytest.approx(610.0)
    offset = None  # a check gone stale later changes nothing: the run was dated once
    assert rc.ran(job) == pytest.approx(610.0)


def test_the_clock_watch_raises_the_alarm_only_beyond_the_setting_and_the_round_trip():
    w = ClockWatch(alarm_s=5.0, fresh_s=90.0)
    assert not w.skewed and w.server_now(100.0, 0.0) is None  # unchecked: no age judged
    assert not w.observe(5.5, 1.0, 0.0)  # 5.5 s within a 1 s round trip: maybe only 4.5
    assert w.server_now(100.0, 0.0) == pytest.approx(94.5)
    assert w.observe(-7.0, 0.5, 1.0) and w.skewed and "behind" in w.describe()
    assert w.server_now(100.0, 1.0) is None
    assert w.observe(0.3, 0.1, 2.0) and not w.skewed
    assert w.server_now(100.0, 200.0) is None  # stale


# ------------------------------------------------------------------------ against nats-server


async def test_the_offset_is_measured_against_the_servers_stamp_of_a_write(nats_url):
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        await health_bucket(js, 1)
        offset, error = await measure(js, "clock-test", 1, 5.0, wall=lambda: time.time() + SKEW_S)
        assert error >= 0 and abs(offset - SKEW_S) <= error + 1.0
        offset, error = await measure(js, "clock-test", 1, 5.0)
        assert abs(offset) <= error + 1.0
    finally:
        await nc.close()

