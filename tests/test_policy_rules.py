"""One test per scheduling rule, on small hand-made clusters (docs/scheduling.md)."""

from __future__ import annotations

import random

from hfai.controller.policy import (
    ANY,
    JobView,
    NodeView,
    PolicyConfig,
    Quotas,
    Resize,
    Start,
    Suspend,
    Wait,
    decide,
    effective_priority,
    resolve_auto,
)
from hfai.protocol.types import ChainState, Priority

LOW, BN, NORMAL, AN, HIGH = (Priority.LOW.value, Priority.BELOW_NORMAL.value, Priority.NORMAL.value,
                             Priority.ABOVE_NORMAL.value, Priority.HIGH.value)
NOW = 100_000.0
CFG = PolicyConfig(slice_s=1800.0)


def nodes(n: int, group: str = "default", prefix: str = "n", down: tuple[int, ...] = ()) -> list[NodeView]:
    return [NodeView(f"{prefix}{i}", group, schedulable=i not in down) for i in range(n)]


def queued(id: str, user: str = "u", prio: int = NORMAL, n: int = 1, submit: float = 0.0, **kw) -> JobView:
    return JobView(id, user, prio, n, submit, kw.pop("state", ChainState.QUEUED), **kw)


def running(id: str, held: tuple[str, ...], user: str = "u", prio: int = NORMAL, started: float = NOW - 60,
            submit: float = 0.0, **kw) -> JobView:
    return JobView(id, user, prio, len(held), submit, kw.pop("state", ChainState.RUNNING), held=held,
                   started_ts=started, **kw)


def names(*idx: int, prefix: str = "n") -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in idx)


def of(decisions, kind) -> dict[str, object]:
    return {d.job_id: d for d in decisions if type(d) is kind}


def run(jobs, cluster, config=CFG, now=NOW):
    return decide(jobs, cluster, now, config)


# ------------------------------------------------------------------------------------- order


def test_higher_priority_starts_first_even_if_submitted_later():
    out = run([queued("a", submit=1), queued("b", prio=HIGH, submit=5)], nodes(1))
    assert list(of(out, Start)) == ["b"]
    assert "a" in of(out, Wait)


def test_fifo_within_a_priority_by_original_submit_time():
    resumed = queued("old", submit=1, state=ChainState.SUSPENDED)
    out = run([queued("new", submit=2), resumed], nodes(1))
    assert list(of(out, Start)) == ["old"]


def test_within_a_priority_less_attained_service_goes_first_then_fifo():
    # Service bands are 2, 16 and 128 slices of node-time: 1 h on one node is band 1.
    ran_an_hour = queued("a", user="x", submit=0, run_s=3600.0, state=ChainState.SUSPENDED)
    ran_less = queued("b", user="x", submit=1, run_s=3599.0, state=ChainState.SUSPENDED)
    new = queued("c", user="y", submit=50)
    assert list(of(run([ran_an_hour, new], nodes(1)), Start)) == ["c"]  # band 0 before band 1
    assert list(of(run([ran_less, new], nodes(1)), Start)) == ["b"]  # same band: first come
    # Service is node-time: an hour on two nodes is two hours of service.
    assert list(of(run([queued("d", n=2, run_s=1800.0, submit=0, state=ChainState.SUSPENDED),
                        queued("e", n=2, submit=9)], nodes(2)), Start)) == ["e"]


# ---------------------------------------------------------------------------------- gangs


def test_gang_gets_all_its_nodes_or_none():
    out = run([running("r", names(0), user="v"), queued("g", n=3)], nodes(3))
    assert not of(out, Start)
    assert "g" in of(out, Wait)


def test_start_nodes_are_free_and_distinct():
    out = run([running("r", names(1), user="v"), queued("a", n=2)], nodes(3))
    assert of(out, Start)["a"].nodes == names(0, 2)


# ------------------------------------------------------------------------------ preemption


def test_preempts_lowest_priority_first_then_most_recently_started():
    jobs = [
        running("low_old", names(0), prio=LOW, started=NOW - 500),
        running("low_new", names(1), prio=LOW, started=NOW - 100),
        running("bn", names(2), prio=BN, started=NOW - 10),
        queued("h", prio=HIGH, user="boss"),
    ]
    out = run(jobs, nodes(3))
    assert list(of(out, Suspend)) == ["low_new"]
    assert of(out, Suspend)["low_new"].for_job == "h"
    assert "HIGH" in of(out, Suspend)["low_new"].reason
    out = run([*jobs[:3], queued("h", prio=HIGH, n=3, user="boss")], nodes(3))
    assert set(of(out, Suspend)) == {"low_new", "low_old", "bn"}


def test_victims_not_needed_after_all_are_dropped():
    jobs = [
        running("small", names(0), prio=LOW, started=NOW - 10),
        running("big", names(1, 2), prio=LOW, started=NOW - 500),
        queued("h", prio=HIGH, n=2),
    ]
    out = run(jobs, nodes(3))
    assert list(of(out, Suspend)) == ["big"]


def test_no_preemption_when_it_cannot_free_enough():
    jobs = [running("low", names(0), prio=LOW), running("mine", names(1), prio=HIGH, user="boss"),
            queued("h", prio=HIGH, n=2, user="boss")]
    out = run(jobs, nodes(2))
    assert not of(out, Suspend)
    assert "may not preempt" in of(out, Wait)["h"].reason


def test_a_job_in_its_interrupt_window_counts_as_leaving_and_is_not_asked_twice():
    jobs = [
        running("going", names(0), prio=LOW, state=ChainState.SUSPENDING),
        running("low2", names(1), prio=LOW),
        queued("h", prio=HIGH),
    ]
    out = run(jobs, nodes(2))
    assert not of(out, Suspend)  # the leaving node is enough
    assert "being released" in of(out, Wait)["h"].reason


def test_two_waiting_jobs_do_not_take_the_same_victim():
    jobs = [running("low", names(0), prio=LOW), running("low2", names(1), prio=LOW),
            queued("h1", prio=HIGH, submit=1), queued("h2", prio=HIGH, submit=2)]
    out = run(jobs, nodes(2))
    sus = [d for d in out if isinstance(d, Suspend)]
    assert sorted(d.job_id for d in sus) == ["low", "low2"]
    assert sorted(d.for_job for d in sus) == ["h1", "h2"]


# ---------------------------------------------------------------------------- time slices


def test_time_slice_suspends_another_users_job_with_more_service_after_one_slice():
    out = run([running("r", names(0), user="v", started=NOW - 4000), queued("w", user="u")], nodes(1))
    d = of(out, Suspend)["r"]
    assert d.sliced and d.for_job == "w" and "time slice" in d.reason
    # Held its nodes for a slice but has had no more service than the waiting job: it keeps them.
    out = run([running("r", names(0), user="v", started=NOW - 2000), queued("w", user="u", run_s=500.0)], nodes(1))
    assert not of(out, Suspend)


def test_a_job_that_just_resumed_keeps_its_nodes_for_one_slice():
    out = run([running("r", names(0), user="v", started=NOW - 1000), queued("w", user="u")], nodes(1))
    assert not of(out, Suspend)


def test_a_job_waiting_for_its_time_slice_says_when_its_turn_comes():
    """Issue 13 defect 8: it said "the group is full, and no running job may be preempted for it"."""
    out = run([running("r", names(0), user="v", started=NOW - 1000), queued("w", user="u")], nodes(1))
    # It may be sliced once it has had 2 slices (3600 s) of node-time: 2600 s from now.
    assert of(out, Wait)["w"].reason == "waiting for its time slice, next turn in ~44 min"
    # Two nodes short: the turn comes when the second of the other users' jobs may be sliced.
    jobs = [running("r1", names(0), user="v", started=NOW - 1700), running("r2", names(1), user="x", started=NOW - 60),
            running("mine", names(2), user="u", started=NOW - 10), queued("w", user="u", n=2)]
    assert of(run(jobs, nodes(3)), Wait)["w"].reason == "waiting for its time slice, next turn in ~59 min"
    # Lower-priority nodes it can take now count: only one more node must come from slicing.
    jobs = [running("low", names(0), prio=LOW, user="x"), running("r", names(1), user="v", started=NOW - 1790),
            queued("w", user="u", n=2)]
    assert of(run(jobs, nodes(2)), Wait)["w"].reason == "waiting for its time slice, next turn in ~31 min"
    # Slicing never serves it (its own user's job, or a higher priority holds the nodes): as before.
    for holder in (running("r", names(0), user="u"), running("r", names(0), user="v", prio=HIGH)):
        reason = of(run([holder, queued("w", user="u")], nodes(1)), Wait)["w"].reason
        assert "time slice" not in reason and "may be preempted" in reason
    # The simulator asks for no reasons, and pays nothing for them.
    quiet = PolicyConfig(slice_s=1800.0, explain_waits=False)
    assert run([running("r", names(0), user="v", started=NOW - 1000), queued("w", user="u")], nodes(1), quiet) == []


def test_never_sliced_for_the_same_user_at_the_same_priority():
    out = run([running("r", names(0), user="u", started=NOW - 9999), queued("w", user="u")], nodes(1))
    assert not of(out, Suspend)


def test_slice_takes_the_job_that_held_its_nodes_longest():
    jobs = [running("r1", names(0), user="v", started=NOW - 4000),
            running("r2", names(1), user="x", started=NOW - 5000), queued("w", user="u")]
    assert list(of(run(jobs, nodes(2)), Suspend)) == ["r2"]
    # More service outranks holding longer: r1 has had 20 h of node-time in earlier runs.
    jobs[0] = running("r1", names(0), user="v", started=NOW - 4000, run_s=72000.0)
    assert list(of(run(jobs, nodes(2)), Suspend)) == ["r1"]


# --------------------------------------------------------------------------- quotas, AUTO


def test_over_quota_waits_with_a_reason_and_does_not_block_others():
    config = PolicyConfig(quotas=Quotas({("u", NORMAL, "default"): 2}))
    jobs = [running("r", names(0), user="u"), queued("big", user="u", n=2, submit=1),
            queued("other", user="v", submit=2)]
    out = run(jobs, nodes(4), config)
    assert "over quota" in of(out, Wait)["big"].reason and "1 of 2" in of(out, Wait)["big"].reason
    assert "other" in of(out, Start)


def test_quota_change_takes_effect_on_the_next_decision():
    jobs = [running("r", names(0), user="u"), queued("big", user="u", n=2)]
    tight = PolicyConfig(quotas=Quotas({("u", NORMAL, "default"): 2}))
    loose = PolicyConfig(quotas=Quotas({("u", NORMAL, "default"): 3}))
    assert "big" not in of(run(jobs, nodes(4), tight), Start)
    assert "big" in of(run(jobs, nodes(4), loose), Start)


def test_quota_counts_this_rounds_starts():
    config = PolicyConfig(quotas=Quotas({(ANY, NORMAL, ANY): 1}))
    out = run([queued("a", submit=1), queued("b", submit=2)], nodes(4), config)
    assert list(of(out, Start)) == ["a"] and "over quota" in of(out, Wait)["b"].reason


def test_quota_lookup_prefers_the_most_specific_key():
    q = Quotas({("u", NORMAL, "g"): 1, ("u", NORMAL, ANY): 2, (ANY, NORMAL, "g"): 3, (ANY, NORMAL, ANY): 4})
    assert (q.limit("u", NORMAL, "g"), q.limit("u", NORMAL, "h"), q.limit("v", NORMAL, "g"),
            q.limit("v", NORMAL, "h"), q.limit("v", HIGH, "h")) == (1, 2, 3, 4, None)


def test_auto_picks_the_highest_level_with_quota_room():
    q = Quotas({("u", HIGH, "default"): 2, ("u", NORMAL, "default"): 8})
    holding = [running("r", names(0, 1), user="u", prio=HIGH)]
    assert resolve_auto("u", "default", 2, [], q) == HIGH
    assert resolve_auto("u", "default", 2, holding, q) == NORMAL
    assert resolve_auto("u", "default", 9, holding, q) == NORMAL  # nothing has room: fallback
    assert resolve_auto("u", "default", 1, [], Quotas()) == NORMAL


# ------------------------------------------------------------------------ priority decay


def test_above_normal_decays_to_normal_after_its_running_time():
    config = PolicyConfig(above_normal_s=3600.0)
    fresh = running("a", names(0), prio=AN, user="v", started=NOW - 2000)
    old = running("a", names(0), prio=AN, user="v", started=NOW - 2000, run_s=3000.0)
    assert effective_priority(fresh, NOW, config) == AN
    assert effective_priority(old, NOW, config) == NORMAL
    # Decayed, it is an equal of the NORMAL job and yields its slice; fresh, it does not.
    assert "a" in of(run([old, queued("w", user="u")], nodes(1), config), Suspend)
    assert not of(run([fresh, queued("w", user="u")], nodes(1), config), Suspend)


# ------------------------------------------------------------------------------- elastic


def test_elastic_job_takes_idle_nodes_after_everyone_was_served():
    out = run([queued("e", n=4, min_nodes=1, max_nodes=4, submit=0), queued("b", user="v", n=2, submit=1)], nodes(5))
    assert len(of(out, Start)["b"].nodes) == 2
    assert len(of(out, Start)["e"].nodes) == 3


def test_elastic_job_grows_into_idle_nodes_after_a_slice():
    e = running("e", names(0, 1), min_nodes=2, max_nodes=6, started=NOW - 2000)
    d = of(run([e], nodes(6)), Resize)["e"]
    assert d.size == 6 and d.for_job == "" and not d.sliced
    assert not of(run([running("e", names(0, 1), min_nodes=2, max_nodes=6, started=NOW - 10)], nodes(6)), Resize)


def test_elastic_job_does_not_grow_while_others_wait_for_nodes():
    e = running("e", names(0, 1), min_nodes=2, max_nodes=6, started=NOW - 2000)
    blocked = queued("g", user="v", n=6, prio=HIGH)
    assert not of(run([e, blocked], nodes(6)), Resize)


def test_elastic_job_is_shrunk_rather_than_suspended():
    e = running("e", names(0, 1, 2, 3), min_nodes=2, max_nodes=4, prio=LOW)
    out = run([e, queued("h", prio=HIGH, n=2)], nodes(4))
    d = of(out, Resize)["e"]
    assert d.size == 2 and d.for_job == "h" and isinstance(d, Suspend)


# ------------------------------------------------------------------------ nodes and groups


def test_unschedulable_nodes_get_no_work():
    out = run([queued("a", n=2)], nodes(3, down=(0,)))
    assert of(out, Start)["a"].nodes == names(1, 2)
    out = run([queued("a", n=3)], nodes(3, down=(0,)))
    assert "2 usable" in of(out, Wait)["a"].reason


def test_a_job_runs_only_in_its_group():
    cluster = nodes(2, "a", prefix="a") + nodes(2, "b", prefix="b")
    out = run([queued("x", n=2, group="b"), queued("y", n=3, group="a")], cluster)
    assert of(out, Start)["x"].nodes == ("b0", "b1")
    assert "group 'a' has 2 usable" in of(out, Wait)["y"].reason


# --------------------------------------------------------------------- reservation, backfill


def test_backfill_only_with_jobs_the_blocked_job_could_take_back():
    # "big" cannot preempt its own user's equal job, so it waits; one node is free.
    jobs = [running("mine", names(0), user="u", started=NOW - 50), queued("big", user="u", n=2, submit=1,
                                                                         queued_ts=NOW - 10)]
    out = run([*jobs, queued("lower", user="u", prio=LOW, submit=2)], nodes(2))
    assert "lower" in of(out, Start)
    out = run([*jobs, queued("other", user="v", submit=2)], nodes(2))
    assert "other" in of(out, Start)
    out = run([*jobs, queued("higher_prio_elsewhere", user="v", prio=HIGH, submit=2)], nodes(2))
    assert "higher_prio_elsewhere" in of(out, Start)


def test_own_jobs_backfill_only_until_the_blocked_job_waited_long_enough():
    config = PolicyConfig(own_backfill_s=3600.0)
    mine = running("mine", names(0), user="u", started=NOW - 50)
    young = queued("big", user="u", n=2, submit=1, queued_ts=NOW - 100)
    old = queued("big", user="u", n=2, submit=1, queued_ts=NOW - 4000)
    small = queued("small", user="u", submit=2)
    assert "small" in of(run([mine, young, small], nodes(2), config), Start)
    out = run([mine, old, small], nodes(2), config)
    assert "small" not in of(out, Start)
    assert not of(out, Suspend)
    assert "behind an earlier job" in of(out, Wait)["small"].reason


def test_nodes_a_job_counts_on_are_pinned():
    jobs = [running("going", names(0), prio=LOW, state=ChainState.SUSPENDING), queued("h", prio=HIGH, n=2),
            queued("filler", prio=LOW, user="v")]
    out = run(jobs, nodes(2))
    assert not of(out, Start)  # the free node waits for h, together with the one being released


def test_a_job_behind_a_reservation_does_not_preempt_for_nodes_it_could_not_use():
    config = PolicyConfig(own_backfill_s=0.0)
    jobs = [running("mine", names(0), user="u", started=NOW - 50), running("low", names(1), prio=LOW, user="v"),
            queued("big", user="u", n=3, submit=1), queued("small", user="u", submit=2)]
    out = run(jobs, nodes(3), config)
    assert "low" not in of(out, Suspend)


# ------------------------------------------------------------------------------- general


def test_every_decision_has_a_reason_a_user_can_read():
    jobs = [running("low", names(0), prio=LOW), running("r", names(1), user="v", started=NOW - 5000),
            queued("h", prio=HIGH), queued("w", user="u"), queued("huge", n=9), queued("x", user="z")]
    out = run(jobs, nodes(3))
    assert {type(d) for d in out} >= {Start, Suspend, Wait}
    assert all(len(d.reason) > 8 for d in out)
    assert {d.job_id for d in out if not isinstance(d, Suspend)} >= {"h", "w", "huge", "x"}


def test_decisions_do_not_depend_on_input_order():
    rng = random.Random(3)
    jobs = [running(f"r{i}", names(i), user=f"u{i % 3}", prio=rng.choice([LOW, NORMAL]),
                    started=NOW - rng.uniform(0, 4000)) for i in range(6)]
    jobs += [queued(f"q{i}", user=f"u{i % 4}", prio=rng.choice([NORMAL, HIGH]), n=rng.choice([1, 2]),
                    submit=rng.uniform(0, 100)) for i in range(8)]
    first = run(jobs, nodes(8))
    for _ in range(5):
        rng.shuffle(jobs)
        assert run(jobs, list(reversed(nodes(8)))) == first


def test_quiet_mode_leaves_out_waits_but_not_actions():
    jobs = [running("low", names(0), prio=LOW), queued("h", prio=HIGH), queued("w", user="v")]
    loud = run(jobs, nodes(1))
    quiet = run(jobs, nodes(1), PolicyConfig(explain_waits=False))
    assert [d for d in loud if not isinstance(d, Wait) or d.job_id == "h"] == quiet


# ------------------------------------------------------------- wait wording (issue 24 item 1)


def test_a_job_behind_one_that_took_every_node_says_the_group_is_full_not_reserved():
    """Issue 24 item 1: a LOW job behind a HIGH job that starts on every node said "the free nodes
    are reserved for jobs ahead of it": there are no free nodes, the HIGH job holds them all. The
    gist never changes after that round, so the first wording is the one the user keeps."""
    out = run([queued("big", prio=HIGH, n=2, user="v"), queued("low", prio=LOW)], nodes(2))
    assert list(of(out, Start)) == ["big"]
    assert of(out, Wait)["low"].reason == ("waiting for nodes: the group is full, and no running job "
                                           "may be preempted for it")
    # The next round (the HIGH job running on every node) says the same.
    again = run([running("big", names(0, 1), prio=HIGH, user="v"), queued("low", prio=LOW)], nodes(2))
    assert of(again, Wait)["low"].reason == of(out, Wait)["low"].reason


def test_free_nodes_pinned_for_a_blocked_job_ahead_are_called_reserved():
    # "big" needs 2: one node is free, one is being released; it pins the free one for itself.
    jobs = [running("leaving", names(0), user="x", state=ChainState.SUSPENDING),
            queued("big", prio=HIGH, n=2, user="v"), queued("low", prio=LOW)]
    out = run(jobs, nodes(2))
    assert of(out, Wait)["big"].reason == "waiting for nodes that are being released"
    assert of(out, Wait)["low"].reason == ("waiting for nodes: the free nodes are reserved for jobs ahead "
                                           "of it, and no running job may be preempted for it")
