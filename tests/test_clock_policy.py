"""Issue 38 §3/§4, the policy's own windows: a leader whose wall clock is skewed gives a running job
its whole time slice and a failed run its whole ``--retry`` backoff. Both were ``now`` minus a
wall stamp another host (or an earlier leader) wrote; they are now the leader's monotonic measure
(controller/runclock.py), which the planner shows the policy (Planner._rebase) and the retry gate
reads (PlanSettings.retried)."""

from __future__ import annotations

import asyncio

from fakes import FakeElection, FakeKV

from hfai.controller import transitions as tr
from hfai.controller.leader import Leader
from hfai.controller.nodes import NodeTracker
from hfai.controller.plan import Interrupt, Planner, PlanNode, PlanSettings
from hfai.controller.policy import PolicyConfig, Start
from hfai.controller.runclock import RunClock
from hfai.core.clock import FakeClock
from hfai.core.config import Config
from hfai.kv import KVCache
from hfai.protocol import encode
from hfai.protocol.reasons import ReasonCode
from hfai.protocol.types import ChainState, JobRecord, JobSpec, NodeRecord, Priority, RunEvent, RunEventKind

HOUR = 3600.0
SKEW_S = 2 * HOUR  # how far this leader's wall clock is ahead of the host that wrote the stamps
NOW = 1_000_000.0
SLICE_S = 1800.0


def _job(job_id: str, user: str, retries: int = 0) -> JobRecord:
    spec = JobSpec(name=job_id, entrypoint=("true",), workdir="/w", nodes=1, user=user,
                   priority=Priority.NORMAL.value, retries=retries)
    return JobRecord(id=job_id, spec=spec, state=ChainState.QUEUED, submit_ts=1.0, reason="queued")


def _slice_round(ran_s: float) -> list[tuple[str, str]]:
    """One round of a 1-node cluster: bob's job runs, started ``ran_s`` ago by a host whose clock
    is SKEW_S behind this leader's; alice's job of the same priority waits."""
    running = tr.apply_start(_job("bob1", "bob"), Start("bob1", ("n0",)), NOW - SKEW_S - ran_s, "10.0.0.1", 20000)
    planner = Planner()
    planner.sync({"bob1": running, "alice1": _job("alice1", "alice")})
    settings = PlanSettings(policy=PolicyConfig(slice_s=SLICE_S), ran={"bob1": ran_s})
    actions = planner.plan([PlanNode("n0", address="10.0.0.1")], settings, NOW)
    return [(type(a).__name__, a.job_id) for a in actions if isinstance(a, Interrupt)]


def test_a_leader_ahead_gives_a_running_job_its_whole_time_slice():
    assert _slice_round(5.0) == [], "a run 5 s old lost its slice to the leader's clock"
    # Ripe for a slice by the leader's measure (past its slice and its service band): it yields.
    assert _slice_round(3 * SLICE_S) == [("Interrupt", "bob1")]


def _failed(clock: FakeClock, ago_s: float) -> JobRecord:
    """A job whose run failed ``ago_s`` ago, requeued for a retry by a leader whose clock was SKEW_S
    behind this one's (its ``retry_ts``)."""
    job = tr.apply_start(_job("j1", "bob", retries=2), Start("j1", ("n0",)), 0.0, "10.0.0.1", 20000)
    at = clock.time() - SKEW_S - ago_s
    ev = RunEvent(job_id="j1", run_id=job.run_id, node="n0", event=RunEventKind.EXITED, ts=at, exit_code=1)
    failed = tr.apply_event(job, ev, at)
    assert failed is not None and failed.state.waiting and failed.retry_ts == at
    return failed


def test_the_run_clock_measures_a_retry_backoff_from_its_first_sight():
    clock = FakeClock()
    runs = RunClock(clock)
    job = _failed(clock, ago_s=1.0)
    runs.observe(job.id, job)
    assert runs.waited(job) == 0.0  # seen as it was written: not the 2 h its wall stamp says
    asyncio.run(clock.advance(20.0))
    assert runs.waited(job) == 20.0
    started = tr.apply_start(job, Start("j1", ("n0",)), clock.time(), "10.0.0.1", 20000)
    runs.observe(job.id, started)
    assert runs.waited(started) is None


async def test_a_leader_ahead_keeps_a_failed_run_waiting_its_retry_backoff():
    clock = FakeClock()
    job = _failed(clock, ago_s=1.0)
    kv = FakeKV()
    jobs = KVCache(kv, JobRecord)
    jobs.put_local(job.id, job, kv._put(job.id, encode(job)))
    nodes = NodeTracker(KVCache(FakeKV(), NodeRecord), 10 * 86400.0)
    leader = Leader(Config(), None, kv, None, jobs, nodes, FakeElection(), asyncio.Event(), clock=clock)
    backoff_s = leader._settings(False).retry_backoff_s
    await leader._plan_round()  # the planner takes in the records (and the leader first sees the retry)
    gate = leader.planner._gate(job, leader._round_settings(False), clock.time())
    assert gate is not None, "the backoff was over at once: 2 h of wall stamps on this leader's clock"
    assert gate[1].code == ReasonCode.RETRY_BACKOFF.value
    await clock.advance(backoff_s + 1.0)
    assert leader.planner._gate(job, leader._round_settings(False), clock.time()) is None
