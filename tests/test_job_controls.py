"""Dependencies, job arrays, holds, requeue, updates, time limits and retries (issue 13): the
parsers, the pure transitions, and what the plan does with them (no NATS here; the live cycle is
in test_job_controls_live.py)."""

from __future__ import annotations

import click
import pytest

from hfai.cli.control import parse_array, parse_time
from hfai.controller import transitions
from hfai.controller.plan import Planner, PlanNode, PlanSettings, StopRun, plan_once
from hfai.controller.policy import PolicyConfig, Start
from hfai.controller.validate import check_limits, parse_dependency
from hfai.protocol.errors import IllegalTransition, InvalidRequest
from hfai.protocol.types import ChainState, JobRecord, JobSpec, Priority, RunEvent, RunEventKind

NOW = 1_000_000.0
SETTINGS = PlanSettings(policy=PolicyConfig(slice_s=1800.0))


def spec(name: str = "j", **kw) -> JobSpec:
    return JobSpec(name=name, entrypoint=("true",), workdir="/", user=kw.pop("user", "u"), **kw)


def queued(id: str, submit: float = 0.0, **kw) -> JobRecord:
    return JobRecord(id=id, spec=spec(id, **kw), state=ChainState.QUEUED, submit_ts=submit, reason="queued")


def running(id: str, nodes=("n0",), started: float = NOW - 60, **kw) -> JobRecord:
    return transitions.apply_start(queued(id, **kw), Start(id, nodes), started, "10.0.0.1", 20001)


def cluster(n: int) -> list[PlanNode]:
    return [PlanNode(f"n{i}", address="10.0.0.1") for i in range(n)]


def kinds(actions) -> list[tuple[str, str]]:
    return [(type(a).__name__, a.job_id) for a in actions]


# ------------------------------------------------------------------------------------ parsers


@pytest.mark.parametrize(("text", "seconds"), [("90m", 5400), ("2h", 7200), ("45s", 45), ("1d", 86400),
                                                ("1:30:00", 5400), ("30:00", 1800), ("30", 1800), ("1.5h", 5400)])
def test_durations(text, seconds):
    assert parse_time(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "-5m", "0", "1:2:3:4", "1:-2"])
def test_bad_durations_say_how(text):
    with pytest.raises(click.BadParameter, match="90m|more than 0"):
        parse_time(text)


def test_arrays():
    assert parse_array("0-3") == ((0, 1, 2, 3), 0)
    assert parse_array("1,3,5%2") == ((1, 3, 5), 2)
    assert parse_array("0-15:4") == ((0, 4, 8, 12), 0)
    assert parse_array("7") == ((7,), 0)
    for bad in ("", "3-1", "a-b", "0-3%0", "0-3%x", "1,1", "0-5000", "0-4:0"):
        with pytest.raises(click.BadParameter):
            parse_array(bad)


def test_dependencies_and_limits_are_checked_at_submit():
    assert parse_dependency("abc123") == ("abc123", "ok")
    assert parse_dependency("abc123:any") == ("abc123", "any")
    for bad in ("abc:maybe", "../x", ":ok"):
        with pytest.raises(InvalidRequest):
            parse_dependency(bad)
    for bad in (spec(retries=101), spec(time_limit_s=-1.0), spec(array_limit=-1), spec(after=("a:b",))):
        with pytest.raises(InvalidRequest):
            check_limits(bad)


# -------------------------------------------------------------------------------- transitions


def _exit(job: JobRecord, node: str, code: int) -> RunEvent:
    return RunEvent(job_id=job.id, run_id=job.run_id, node=node, event=RunEventKind.EXITED, ts=NOW, exit_code=code)


def test_a_failed_run_is_retried_then_fails():
    job = running("r", retries=1)
    again = transitions.apply_event(job, _exit(job, "n0", 3), NOW)
    assert again.state is ChainState.SUSPENDED and again.retried == 1 and "retry 1 of 1" in again.reason
    job = transitions.apply_start(again, Start("r", ("n0",)), NOW + 1, "10.0.0.1", 20001)
    failed = transitions.apply_event(job, _exit(job, "n0", 3), NOW + 2)
    assert failed.state is ChainState.FAILED


def test_a_retried_gang_waits_for_its_other_ranks_before_it_is_requeued():
    job = running("g", ("n0", "n1"), retries=2)
    one = transitions.apply_event(job, _exit(job, "n0", 1), NOW)
    assert one.state is ChainState.SUSPENDING and one.retried == 1
    both = transitions.apply_event(one, _exit(one, "n1", 0), NOW)
    assert both.state is ChainState.SUSPENDED and both.nodes == ()


def test_hold_release_requeue_update_apply_only_where_they_mean_something():
    job = queued("q")
    held = transitions.apply_hold(job, "ana", True)
    assert held.hold == "ana" and "held by ana" in held.reason
    assert transitions.apply_hold(held, "ana", False).hold == ""
    with pytest.raises(IllegalTransition, match="only a waiting job"):
        transitions.apply_hold(running("r"), "ana", True)
    requeued = transitions.apply_requeue(running("r"), NOW, "ana")
    assert requeued.state is ChainState.SUSPENDING and requeued.reason == "requeued by ana"
    with pytest.raises(IllegalTransition, match="only a running job"):
        transitions.apply_requeue(job, NOW, "ana")
    changed = transitions.apply_update(job, Priority.HIGH.value, 2)
    assert changed.spec.priority == Priority.HIGH.value and changed.spec.nodes == 2
    with pytest.raises(IllegalTransition):
        transitions.apply_update(running("r"), Priority.HIGH.value, None)


def test_time_limit_counts_every_run():
    job = running("t", started=NOW - 100, time_limit_s=150.0)
    assert not transitions.time_limit_reached(job, NOW)
    job = transitions.requeue(job, NOW, "preempted")  # ran 100 s
    job = transitions.apply_start(job, Start("t", ("n0",)), NOW + 10, "10.0.0.1", 20001)
    assert not transitions.time_limit_reached(job, NOW + 59)
    assert transitions.time_limit_reached(job, NOW + 60)


# ------------------------------------------------------------------------------------ the plan


def test_a_held_job_waits_and_says_so():
    actions = plan_once([transitions.apply_hold(queued("h"), "ana", True)], cluster(1), SETTINGS, NOW)
    assert kinds(actions) == []  # its reason already says it is held: nothing to write
    planner = Planner()
    held = transitions.apply_hold(queued("h"), "ana", True)
    planner.observe(held)
    planner.observe(queued("other", submit=5.0))
    assert kinds(planner.plan(cluster(1), SETTINGS, NOW)) == [("StartRun", "other")]  # h was first in line
    planner.forget("other")
    planner.observe(transitions.apply_hold(held, "ana", False))
    assert kinds(planner.plan(cluster(1), SETTINGS, NOW)) == [("StartRun", "h")]


def test_dependencies_wait_then_start_or_stop_for_good():
    dep = running("a")
    b = queued("b", after=("a",))
    assert kinds(plan_once([dep, b], cluster(2), SETTINGS, NOW)) == [("Explain", "b")]
    done = transitions.apply_event(dep, _exit(dep, "n0", 0), NOW)
    assert done.state is ChainState.SUCCEEDED
    assert kinds(plan_once([done, b], cluster(2), SETTINGS, NOW)) == [("StartRun", "b")]
    failed = transitions.apply_event(dep, _exit(dep, "n0", 1), NOW)
    actions = plan_once([failed, b], cluster(2), SETTINGS, NOW)
    assert kinds(actions) == [("StopRun", "b")] and "never satisfied" in actions[0].reason
    any_end = queued("c", after=("a:any",))
    assert kinds(plan_once([failed, any_end], cluster(2), SETTINGS, NOW)) == [("StartRun", "c")]


def test_an_array_runs_at_most_its_limit_at_once():
    members = [queued(f"m{i}", array_id="arr", array_index=i, array_limit=2, submit=float(i)) for i in range(4)]
    actions = plan_once(members, cluster(4), SETTINGS, NOW)
    assert [a.job_id for a in actions if type(a).__name__ == "StartRun"] == ["m0", "m1"]
    assert {a.job_id for a in actions if type(a).__name__ == "Explain"} == {"m2", "m3"}
    # One running: one more may start.
    members[0] = running("m0", array_id="arr", array_index=0, array_limit=2)
    starts = [a.job_id for a in plan_once(members, cluster(4), SETTINGS, NOW) if type(a).__name__ == "StartRun"]
    assert starts == ["m1"]


def test_a_job_past_its_time_limit_is_stopped():
    job = running("t", started=NOW - 200, time_limit_s=120.0)
    actions = plan_once([job], cluster(1), SETTINGS, NOW)
    assert kinds(actions) == [("StopRun", "t")] and "time limit reached" in actions[0].reason
    assert isinstance(actions[0], StopRun)
    stopping = actions[0].apply(job, NOW)
    assert stopping.state is ChainState.STOPPING


# ------------------------------------------------------------------------------ start estimates


def test_start_estimates_replay_the_plan_with_time_limits():
    from hfai.controller.estimate import estimate_starts

    a = running("a", started=NOW - 600, time_limit_s=3600.0)  # 50 min left
    b = queued("b", submit=1.0, time_limit_s=1800.0)
    c = queued("c", submit=2.0)  # no limit: runs for ever
    d = queued("d", submit=3.0, time_limit_s=60.0)
    starts = estimate_starts([a, b, c, d], cluster(1), SETTINGS, NOW)
    assert starts == {"b": NOW + 3000.0, "c": NOW + 3000.0 + 1800.0}  # d waits behind c: no estimate
    assert estimate_starts([a, b, c, d], cluster(1), SETTINGS, NOW, default_run_s=600.0)["d"] == NOW + 5400.0
    # The live policy decides: a HIGH job preempts the LOW one and starts once its nodes are released.
    low = running("low", priority=Priority.LOW.value, time_limit_s=86400.0)
    high = queued("high", priority=Priority.HIGH.value, user="v")
    assert estimate_starts([low, high], cluster(1), SETTINGS, NOW, release_s=60.0) == {"high": NOW + 60.0}
    # A held job gets no estimate; one that depends on another starts after it.
    held = transitions.apply_hold(queued("h", time_limit_s=60.0), "ana", True)
    after = queued("after", submit=5.0, after=("b",), time_limit_s=60.0)
    starts = estimate_starts([a, b, held, after], cluster(2), SETTINGS, NOW)
    assert "h" not in starts and starts["b"] == NOW and starts["after"] == NOW + 1800.0


def test_without_time_limits_the_estimate_guesses_from_the_clusters_history():
    import dataclasses

    from hfai.controller.estimate import Guess, estimate_starts, guess_from_history

    # The jobs that finished here ran 10, 20 and 40 min: a job is guessed to run 20 min.
    done = [dataclasses.replace(queued(f"d{i}"), state=ChainState.SUCCEEDED, run_s=m * 60.0)
            for i, m in enumerate((10, 20, 40))]
    guess = guess_from_history(done)
    assert guess == Guess(1200.0) and guess_from_history([]) == Guess(3600.0)
    young = running("young", started=NOW - 300)  # 5 min in: 15 min left of the 20
    waiting = queued("w", submit=1.0)
    assert estimate_starts([*done, young, waiting], cluster(1), SETTINGS, NOW) == {}  # no guess: for ever
    assert estimate_starts([*done, young, waiting], cluster(1), SETTINGS, NOW, guess=guess) == {"w": NOW + 900.0}
    # One that already ran longer than the typical job: as long again as it has (an hour more).
    old = running("old", started=NOW - 3600)
    assert estimate_starts([*done, old, waiting], cluster(1), SETTINGS, NOW, guess=guess) == {"w": NOW + 3600.0}
    # A job behind an unlimited one started in the replay waits the typical run after it.
    later = queued("later", submit=2.0)
    starts = estimate_starts([*done, young, waiting, later], cluster(1), SETTINGS, NOW, guess=guess)
    assert starts == {"w": NOW + 900.0, "later": NOW + 900.0 + 1200.0}
    # --assume wins over the guess.
    assert estimate_starts([young, waiting], cluster(1), SETTINGS, NOW, default_run_s=60.0, guess=guess) == {
        "w": NOW + 60.0}
