"""The spine's scheduling rules on small hand-made clusters (pure function, no I/O)."""

from __future__ import annotations

from hfai.controller.policy import JobView, NodeView, PolicyConfig, Start, Suspend, Wait, decide
from hfai.protocol.types import ChainState

Q, R, S = ChainState.QUEUED, ChainState.RUNNING, ChainState.SUSPENDING
CFG = PolicyConfig(slice_s=100.0)


def nodes(n: int, group: str = "default") -> list[NodeView]:
    return [NodeView(f"n{i}", group) for i in range(n)]


def job(id, prio=10, n=1, ts=0.0, state=Q, user="u", held=(), started=0.0, turns=0, run_s=0.0) -> JobView:
    return JobView(id=id, user=user, priority=prio, nodes=n, submit_ts=ts, state=state, held=held,
                   started_ts=started, slice_turns=turns, run_s=run_s)


def of(kind, decisions):
    return [d for d in decisions if isinstance(d, kind)]


def test_fifo_within_priority_and_gang_allocation():
    ds = decide([job("b", ts=2, n=2), job("a", ts=1, n=2), job("c", ts=3)], nodes(4), 10, CFG)
    starts = of(Start, ds)
    assert [(s.job_id, len(s.nodes)) for s in starts] == [("a", 2), ("b", 2)]
    assert set(starts[0].nodes).isdisjoint(starts[1].nodes)
    assert [w.job_id for w in of(Wait, ds)] == ["c"]


def test_higher_priority_goes_first():
    ds = decide([job("low", prio=0, ts=1), job("high", prio=30, ts=2)], nodes(1), 10, CFG)
    assert [s.job_id for s in of(Start, ds)] == ["high"]


def test_higher_priority_preempts_lowest_then_most_recently_started():
    running = [job("old", prio=0, state=R, held=("n0",), started=1),
               job("new", prio=0, state=R, held=("n1",), started=5),
               job("mid", prio=10, state=R, held=("n2",), started=9, user="v")]
    ds = decide([*running, job("urgent", prio=30, ts=20)], nodes(3), 20, CFG)
    assert [(s.job_id, s.for_job, s.sliced) for s in of(Suspend, ds)] == [("new", "urgent", False)]
    assert not of(Start, ds)


def test_a_gang_is_preempted_whole_and_only_if_enough_nodes_come_free():
    running = [job("two", prio=0, n=2, state=R, held=("n0", "n1"), started=1),
               job("vip", prio=40, state=R, held=("n2",), started=1)]
    ds = decide([*running, job("one", prio=30, ts=5)], nodes(3), 10, CFG)
    assert [s.job_id for s in of(Suspend, ds)] == ["two"]
    # Needing 3 nodes while only 2 are preemptible: nobody is interrupted for nothing.
    ds = decide([*running, job("three", prio=30, n=3, ts=5)], nodes(3), 10, CFG)
    assert not of(Suspend, ds) and of(Wait, ds)


def test_no_double_preemption_while_a_victim_is_leaving():
    jobs = [job("victim", prio=0, state=S, held=("n0",), started=1), job("other", prio=0, state=R, held=("n1",)),
            job("urgent", prio=30, ts=5)]
    ds = decide(jobs, nodes(2), 10, CFG)
    assert not of(Suspend, ds)
    assert "being released" in of(Wait, ds)[0].reason


def test_time_slice_only_after_two_slices_of_service_and_never_for_the_same_user():
    holder = job("holder", user="alice", state=R, held=("n0",), started=0)
    assert not of(Suspend, decide([holder, job("w", user="bob", ts=1)], nodes(1), 150, CFG))
    ds = decide([holder, job("w", user="bob", ts=1)], nodes(1), 250, CFG)
    assert [(s.job_id, s.sliced) for s in of(Suspend, ds)] == [("holder", True)]
    assert "time slice" in of(Suspend, ds)[0].reason
    assert not of(Suspend, decide([holder, job("w", user="alice", ts=1)], nodes(1), 250, CFG))


def test_round_robin_prefers_jobs_that_had_less_service():
    ds = decide([job("yielded", ts=1, turns=1, run_s=250), job("fresh", ts=2, turns=0)], nodes(1), 10, CFG)
    assert [s.job_id for s in of(Start, ds)] == ["fresh"]


def test_blocked_job_lets_only_jobs_it_could_preempt_backfill():
    running = [job("vip", prio=40, state=R, held=("n0",))]
    ds = decide([*running, job("big", prio=30, n=2, ts=1), job("small", prio=0, ts=2)], nodes(2), 10, CFG)
    # "big" cannot run yet; "small" may use the free node because "big" can take it back later.
    assert [(s.job_id, s.nodes) for s in of(Start, ds)] == [("small", ("n1",))]
    # Its own user's equal-priority job (which it may never preempt) backfills only for a while.
    own = [*running, job("big", prio=30, n=2, ts=1), job("mine", prio=30, ts=2)]
    assert [s.job_id for s in of(Start, decide(own, nodes(2), 10, CFG))] == ["mine"]
    assert not of(Start, decide(own, nodes(2), 10 + CFG.own_backfill_s, CFG))


def test_blocked_job_waiting_for_released_nodes_pins_the_free_ones():
    jobs = [job("victim", prio=0, state=S, held=("n0",), started=1), job("big", prio=30, n=2, ts=1),
            job("small", prio=0, ts=2)]
    ds = decide(jobs, nodes(2), 10, CFG)
    assert not of(Start, ds)


def test_unschedulable_nodes_and_groups():
    ns = [NodeView("n0"), NodeView("n1", schedulable=False), NodeView("g0", group="big")]
    ds = decide([job("a", n=1), job("b", n=2, ts=1)], ns, 10, CFG)
    assert [s.nodes for s in of(Start, ds)] == [("n0",)]
    assert "has 1 usable" in of(Wait, ds)[0].reason


def test_deterministic():
    jobs = [job(f"j{i}", prio=i % 3 * 10, n=1 + i % 2, ts=i) for i in range(20)]
    assert decide(jobs, nodes(8), 10, CFG) == decide(list(reversed(jobs)), nodes(8), 10, CFG)
