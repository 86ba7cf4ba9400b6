"""Issue 24's everyday rough edges in the controller's pure parts: a retry is its own count with a
backoff (item 3), a job waiting for a victim that has not acknowledged its interrupt says which
and when it will be stopped (item 9), and the levels above NORMAL need a quota unless opened
(item 12). The wording of waits with no free node is in test_policy_rules.py (item 1)."""

from __future__ import annotations

from hfai.agent.jobenv import job_environment
from hfai.controller import transitions
from hfai.controller.assignments import desired_assignments
from hfai.controller.plan import Explain, Planner, PlanNode, PlanSettings, StartRun
from hfai.controller.policy import PolicyConfig, Start
from hfai.protocol import reasons
from hfai.protocol.reasons import Reason
from hfai.protocol.types import ChainState, JobRecord, JobSpec, RunEvent, RunEventKind

_PREEMPTED = reasons.preempted(job="w", priority="HIGH", victim_priority="NORMAL")

NOW = 1_000_000.0
SETTINGS = PlanSettings(policy=PolicyConfig(slice_s=1800.0), retry_backoff_s=30.0, retry_backoff_max_s=100.0)


def queued(id: str, **kw) -> JobRecord:
    spec = JobSpec(name=id, entrypoint=("true",), workdir="/", user=kw.pop("user", "u"), **kw)
    return JobRecord(id=id, spec=spec, state=ChainState.QUEUED, submit_ts=0.0, reason="queued")


def start(job: JobRecord, now: float, nodes=("n0",)) -> JobRecord:
    return transitions.apply_start(job, Start(job.id, nodes), now, "10.0.0.1", 20001)


def fail(job: JobRecord, now: float, node: str = "n0", code: int = 1) -> JobRecord:
    ev = RunEvent(job_id=job.id, run_id=job.run_id, node=node, event=RunEventKind.EXITED, ts=now, exit_code=code)
    return transitions.apply_event(job, ev, now)


def cluster(n: int) -> list[PlanNode]:
    return [PlanNode(f"n{i}", address="10.0.0.1") for i in range(n)]


def plan(job: JobRecord, now: float, settings: PlanSettings = SETTINGS):
    planner = Planner()
    planner.observe(job)
    return planner.plan(cluster(1), settings, now)


# ------------------------------------------------------------------------------ item 3: retry


def test_a_retried_run_counts_as_a_retry_not_a_suspension():
    """Issue 24 item 3: `runs 3 (suspended 2 times...)` and HFAI_SUSPEND_COUNT 1 then 2 for a job
    that was never preempted."""
    job = start(queued("r", retries=3), NOW)
    once = fail(job, NOW + 10)
    assert once.state is ChainState.SUSPENDED
    assert (once.suspend_count, once.retried) == (0, 1)
    # A gang: the other rank stops first; the requeue still counts no suspension.
    gang = start(queued("g", retries=2, nodes=2), NOW, ("n0", "n1"))
    one = fail(gang, NOW + 1, "n0")
    both = fail(one, NOW + 2, "n1", code=0)
    assert both.state is ChainState.SUSPENDED and (both.suspend_count, both.retried) == (0, 1)
    # A real preemption of the retried job still counts as one.
    again = start(once, NOW + 100)
    assert again.retry_ts == 0.0
    sus = transitions.apply_suspend(again, transitions.Suspend("r", _PREEMPTED, for_job="x"), NOW + 200)
    done = transitions.requeue(sus, NOW + 201, "acknowledged")
    assert (done.suspend_count, done.retried) == (1, 1)


def test_the_job_sees_its_retry_count_in_hfai_retry_count():
    job = start(queued("r", retries=3), NOW)
    job = start(fail(job, NOW + 1), NOW + 100)
    [ra] = desired_assignments([job], ["n0"], 1, 60.0, 30.0)["n0"].runs
    env = job_environment(ra, "n0", "/tmp/control")
    assert env["HFAI_RETRY_COUNT"] == "1" and env["HFAI_SUSPEND_COUNT"] == "0"


def test_a_retry_waits_out_a_doubling_backoff_and_says_so():
    """Issue 24 item 3: all retries restarted in the same second."""
    assert [transitions.retry_backoff(k, 30.0, 100.0) for k in (1, 2, 3, 4)] == [30.0, 60.0, 100.0, 100.0]
    failed = fail(start(queued("r", retries=3), NOW), NOW)
    early = plan(failed, NOW + 5)
    assert not [a for a in early if isinstance(a, StartRun)]
    [why] = [a.reason for a in early if isinstance(a, Explain)]
    assert why == "retry 1 of 3 after a failed run: backing off, starts again in ~25 s"
    assert [type(a).__name__ for a in plan(failed, NOW + 30)] == ["StartRun"]
    # The second retry waits twice as long.
    second = fail(start(failed, NOW + 30), NOW + 40)
    assert second.retried == 2
    assert not [a for a in plan(second, NOW + 90) if isinstance(a, StartRun)]
    assert [type(a).__name__ for a in plan(second, NOW + 100)] == ["StartRun"]
    # Backoff off (0): at once, as before.
    off = PlanSettings(policy=PolicyConfig(slice_s=1800.0), retry_backoff_s=0.0)
    assert [type(a).__name__ for a in plan(failed, NOW, off)] == ["StartRun"]


def test_the_backoff_end_bounds_a_quiet_planner():
    failed = fail(start(queued("r", retries=1), NOW), NOW)
    planner = Planner()
    planner.observe(failed)
    planner.plan(cluster(1), SETTINGS, NOW + 1)
    assert planner.quiet_until(SETTINGS, NOW + 1) <= NOW + 30


# ---------------------------------------------------------------- item 9: an unacknowledged victim


def _suspending(id: str, since: float, acked: tuple[str, ...] = ()) -> JobRecord:
    job = start(queued(id, user="v", priority=20), since - 600)
    job = transitions.apply_suspend(job, transitions.Suspend(id, _PREEMPTED, for_job="w"), since)
    return transitions.replace(job, acked=acked)


def _why(records, now: float) -> Reason:
    planner = Planner()
    for r in records:
        planner.observe(r)
    settings = PlanSettings(policy=PolicyConfig(slice_s=1800.0), ack_window_s=60.0, kill_window_s=30.0)
    return {a.job_id: a.why for a in planner.plan(cluster(1), settings, now) if isinstance(a, Explain)}["w"]


def _reason(records, now: float) -> str:
    return _why(records, now).text()


def test_a_job_waiting_on_a_victim_that_ignores_its_interrupt_says_which_and_when_it_is_stopped():
    """Issue 24 item 9: it only said "waiting for preempted jobs to checkpoint..." (or "...nodes
    that are being released") however long the victim ignored the suspend flag."""
    since = 1_000_020.0  # 13:47:00 UTC
    waiting = queued("w", priority=40)
    assert _reason([_suspending("lazy", since), waiting], since + 10) == (
        "waiting for job lazy to release its nodes: it has not acknowledged its interrupt (asked at "
        "13:47:00 UTC); the platform stops it at 13:48:00 UTC if it does not")
    assert _reason([_suspending("lazy", since), waiting], since + 61) == (
        "waiting for job lazy to release its nodes: it did not acknowledge its interrupt (asked at "
        "13:47:00 UTC); stopped at 13:48:00 UTC, killed at 13:48:30 UTC if still running")
    # A victim that acknowledged is simply checkpointing: the reason stays the policy's.
    assert _reason([_suspending("good", since, acked=("n0",)), waiting], since + 10) == (
        "waiting for nodes that are being released")
    # The gist changes (so the leader writes it) when the waiting job first learns who holds it up.
    assert _why([_suspending("good", since, acked=("n0",)), waiting], since + 10).gist() != _why(
        [_suspending("lazy", since), waiting], since + 10).gist()


# ------------------------------------------------------------- item 12: no quota by default


def test_levels_above_normal_need_a_quota_on_a_live_cluster_but_operators_are_exempt():
    """Issue 24 item 12: with no quota table, any user submitted at EXTREME_HIGH and preempted
    everyone."""
    import pytest

    from hfai.controller.policy import ANY, Quotas
    from hfai.controller.validate import check_quota
    from hfai.protocol.errors import InvalidRequest
    from hfai.protocol.quotas import quotas_of
    from hfai.protocol.types import Priority, QuotaEntry, QuotaTable

    live = quotas_of(None)
    top = JobSpec(name="x", entrypoint=("true",), workdir="/", user="bob", priority=Priority.EXTREME_HIGH.value)
    with pytest.raises(InvalidRequest, match="EXTREME_HIGH needs a quota and bob has none"):
        check_quota(top, live)
    for level in (Priority.LOW, Priority.NORMAL):
        check_quota(transitions.replace(top, priority=level.value), live)  # no limit, as before
    check_quota(transitions.replace(top, by_operator=True), live)  # the cluster's operators may
    # An operator opens a level for everyone with a '*' quota, or for one user.
    opened = quotas_of(QuotaTable(entries=(QuotaEntry(user=ANY, priority=Priority.EXTREME_HIGH.value, group=ANY,
                                                      nodes=4),)))
    check_quota(top, opened)
    # The configuration can open every level (quota_needed_above = EXTREME_HIGH), and the pure
    # policy's own default (the simulator's) closes none.
    check_quota(top, quotas_of(None, Priority.EXTREME_HIGH.value))
    assert Quotas().limit("bob", Priority.EXTREME_HIGH.value, "default") is None


def test_a_waiting_job_at_a_closed_level_says_it_needs_a_quota_and_preempts_nobody():
    from hfai.controller.policy import JobView, NodeView, Suspend, Wait, decide
    from hfai.protocol.quotas import quotas_of
    from hfai.protocol.types import Priority

    config = PolicyConfig(slice_s=1800.0, quotas=quotas_of(None))
    low = JobView("low", "alice", Priority.LOW.value, 1, 0.0, ChainState.RUNNING, held=("n0",), started_ts=NOW - 60)
    top = JobView("top", "bob", Priority.EXTREME_HIGH.value, 1, 1.0, ChainState.QUEUED)
    out = decide([low, top], [NodeView("n0")], NOW, config)
    assert not [d for d in out if isinstance(d, Suspend)]
    [wait] = [d for d in out if isinstance(d, Wait)]
    assert wait.reason == ("over quota: EXTREME_HIGH needs a quota and user 'bob' has none in group 'default' "
                           "(levels above NORMAL are closed until an operator sets one; or hfai update top -p NORMAL)")
    # An operator's job is exempt: it preempts the LOW job as it always did.
    boss = JobView("top", "root", Priority.EXTREME_HIGH.value, 1, 1.0, ChainState.QUEUED, exempt=True)
    assert [d.job_id for d in decide([low, boss], [NodeView("n0")], NOW, config) if isinstance(d, Suspend)] == ["low"]


def test_hfai_quota_says_what_the_defaults_are():
    from hfai.cli import render
    from hfai.protocol.types import QuotaTable

    text = render.quotas_table(QuotaTable(), 10)
    assert text.startswith("no quotas set\n") and "ABOVE_NORMAL, HIGH, VERY_HIGH, EXTREME_HIGH are closed" in text
    rows = render.quota_use("bob", QuotaTable(), [], ["default"], 10)
    assert [(r.priority, r.limit) for r in rows] == [(50, 0), (40, 0), (30, 0), (20, 0)]
    assert "operators' jobs" in render.quota_use_table("bob", rows, 10)
    # An older controller that does not say: nothing claimed.
    assert render.quotas_table(QuotaTable()).endswith("every level has no limit")

