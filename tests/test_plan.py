"""The leader's plan without NATS (controller/plan.py): records + nodes + settings + time -> the
record changes, table-driven; an index kept up to date between rounds plans exactly what a fresh
one does; and, replayed through the simulator, a waiting higher-priority job never waits while
lower-priority jobs hold nodes it could use, apart from the interrupt window."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfai.controller import transitions
from hfai.controller.plan import (
    Explain,
    Planner,
    PlanNode,
    PlanSettings,
    StartRun,
    plan_once,
)
from hfai.controller.policy import PolicyConfig, Start, effective_priority
from hfai.controller.views import job_view
from hfai.protocol.types import ChainState, JobRecord, JobSpec, Priority
from hfai.sim import SimConfig, Simulator, TraceJob

NOW = 1_000_000.0
LOW, NORMAL, HIGH = Priority.LOW.value, Priority.NORMAL.value, Priority.HIGH.value
SETTINGS = PlanSettings(policy=PolicyConfig(slice_s=1800.0))


def rec(id: str, state: ChainState = ChainState.QUEUED, *, user: str = "u", prio: int = NORMAL, n: int = 1,
        nodes: tuple[str, ...] = (), submit: float = 0.0, started: float = NOW - 60, reason: str = "queued",
        run_id: int = 0) -> JobRecord:
    spec = JobSpec(name=id, entrypoint=("true",), workdir="/", nodes=n, priority=prio, user=user)
    r = JobRecord(id=id, spec=spec, state=ChainState.QUEUED, submit_ts=submit, reason=reason)
    if state is ChainState.QUEUED:
        return r
    r = transitions.apply_start(r, Start(id, nodes), started, "10.0.0.1", 20000 + len(id)) or r
    if state is ChainState.SUSPENDING:
        r = r.transition(ChainState.SUSPENDING, started + 1, "preempted")
    return r


def cluster(n: int, *, down: tuple[int, ...] = (), drained: tuple[int, ...] = ()) -> list[PlanNode]:
    return [PlanNode(f"n{i}", alive=i not in down, schedulable=i not in down and i not in drained,
                     address=f"10.0.0.{i + 1}") for i in range(n)]


def kinds(actions) -> list[tuple[str, str]]:
    return [(type(a).__name__, a.job_id) for a in actions]


def apply_all(records: dict[str, JobRecord], actions, now: float) -> dict[str, JobRecord]:
    """What the leader writes: each action's change on the record as it is then."""
    out = dict(records)
    for a in actions:
        after = a.apply(out[a.job_id], now)
        if after is not None:
            out[a.job_id] = after
    return out


# --------------------------------------------------------------------------------- the table


CASES = [
    pytest.param([rec("a")], cluster(1), {}, [("StartRun", "a")], id="a free node starts a queued job"),
    pytest.param([rec("a", n=2)], cluster(2, drained=(1,)), {},
                 [("Explain", "a")], id="a drained node gets no work"),
    pytest.param([rec("low", ChainState.RUNNING, prio=LOW, nodes=("n0",)), rec("hi", prio=HIGH, user="v")],
                 cluster(1), {}, [("Interrupt", "low"), ("Explain", "hi")], id="higher priority preempts"),
    pytest.param([rec("r", ChainState.RUNNING, nodes=("n0",))], cluster(2, down=(0,)), {},
                 [("LoseNode", "r"), ("StartRun", "r")], id="a lost node's job is requeued and restarted"),
    pytest.param([rec("r", ChainState.RUNNING, nodes=("n0",))],
                 [PlanNode("n0", faulty=True, schedulable=False), PlanNode("n1")], {},
                 [("Interrupt", "r")], id="a faulty node's job is interrupted, not dropped (no overlap)"),
    pytest.param([rec("r", ChainState.RUNNING, nodes=("n0",)), rec("w", user="bob")], cluster(2), {"bob": "5 TB"},
                 [("Explain", "w")], id="a restricted user's waiting job stays waiting"),
    pytest.param([rec("r", ChainState.RUNNING, user="bob", nodes=("n0",)), rec("w")], cluster(1), {"bob": "5 TB"},
                 [("Interrupt", "r"), ("Explain", "w")], id="a restricted user's running job is interrupted"),
    pytest.param([rec("s", ChainState.SUSPENDING, prio=LOW, nodes=("n0",)), rec("hi", prio=HIGH)], cluster(1), {},
                 [("Explain", "hi")], id="nothing is asked twice in the interrupt window"),
]


@pytest.mark.parametrize(("records", "nodes", "restricted", "expected"), CASES)
def test_plan_table(records, nodes, restricted, expected):
    settings = PlanSettings(policy=SETTINGS.policy, restricted=restricted)
    actions = plan_once(records, nodes, settings, NOW)
    assert kinds(actions) == expected


def test_a_start_carries_the_rank0_address_and_distinct_ports():
    nodes = [PlanNode("n0", address="10.0.0.9"), PlanNode("n1", address="10.0.0.9")]
    actions = plan_once([rec("a"), rec("b", submit=1)], nodes, SETTINGS, NOW)
    starts = [a for a in actions if isinstance(a, StartRun)]
    assert [s.master_addr for s in starts] == ["10.0.0.9", "10.0.0.9"]
    assert starts[0].master_port != starts[1].master_port
    after = apply_all({r.id: r for r in (rec("a"), rec("b", submit=1))}, actions, NOW)
    assert after["a"].state is ChainState.RUNNING and after["a"].master_port == starts[0].master_port


def test_restriction_reason_and_interruption_are_applied_like_any_other():
    records = {r.id: r for r in (rec("r", ChainState.RUNNING, user="bob", nodes=("n0",)), rec("w", user="bob"))}
    settings = PlanSettings(policy=SETTINGS.policy, restricted={"bob": "workspaces over 5 TB"})
    actions = plan_once(records.values(), cluster(2), settings, NOW)
    after = apply_all(records, actions, NOW)
    assert after["r"].state is ChainState.SUSPENDING and "restricted: workspaces over 5 TB" in after["r"].reason
    assert after["w"].state is ChainState.QUEUED and after["w"].reason == "restricted: workspaces over 5 TB"
    # Lifted: the waiting job starts on a free node at the next round.
    assert ("StartRun", "w") in kinds(plan_once(after.values(), cluster(2), SETTINGS, NOW + 1))


def test_wait_reasons_are_written_when_their_gist_changes_and_not_more_often_than_the_interval():
    planner = Planner()
    records = {r.id: r for r in (rec("r", ChainState.RUNNING, prio=HIGH, nodes=("n0",)), rec("w"))}
    for r in records.values():
        planner.observe(r)
    first = planner.plan(cluster(1), SETTINGS, NOW)
    assert kinds(first) == [("Explain", "w")]
    records = apply_all(records, first, NOW)
    for r in records.values():
        planner.observe(r)
    assert planner.plan(cluster(1), SETTINGS, NOW + 1) == []  # same reason: nothing to write
    # A different gist (the node is drained now) within the interval waits for it.
    drained = cluster(1, drained=(0,))
    assert [a for a in planner.plan(drained, SETTINGS, NOW + 2) if isinstance(a, Explain)] == []
    later = planner.plan(drained, SETTINGS, NOW + 2 + SETTINGS.wait_reason_interval_s)
    assert kinds(later) == [("Explain", "w")]


def test_quiet_rounds_make_the_same_decisions_without_reasons():
    records = [rec("low", ChainState.RUNNING, prio=LOW, nodes=("n0",)), rec("hi", prio=HIGH, user="v"),
               rec("w1", n=2), rec("w2", submit=5)]
    loud = plan_once(records, cluster(2), SETTINGS, NOW)
    quiet_settings = PlanSettings(policy=PolicyConfig(slice_s=1800.0, explain_waits=False))
    quiet = plan_once(records, cluster(2), quiet_settings, NOW)
    assert [a for a in loud if not isinstance(a, Explain)] == quiet
    assert any(isinstance(a, Explain) for a in loud)


# ------------------------------------------------------------------- incremental == from scratch


@st.composite
def histories(draw):
    """A cluster and a series of rounds, each changing a few records at random."""
    n_nodes = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 10_000))
    rounds = draw(st.integers(1, 12))
    return n_nodes, seed, rounds


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_a_planner_fed_changes_plans_what_a_fresh_one_does(history):
    n_nodes, seed, rounds = history
    rng = random.Random(seed)
    nodes = cluster(n_nodes)
    quiet = PlanSettings(policy=PolicyConfig(slice_s=100.0, explain_waits=False))
    planner = Planner()
    records: dict[str, JobRecord] = {}
    now = 1000.0
    for k in range(rounds):
        for _ in range(rng.randrange(4)):  # arrivals
            job_id = f"j{k}-{rng.randrange(10**6)}"
            records[job_id] = rec(job_id, user=rng.choice("abc"), prio=rng.choice((LOW, NORMAL, HIGH)),
                                  n=rng.randint(1, n_nodes), submit=now)
            planner.observe(records[job_id])
        actions = planner.plan(nodes, quiet, now)
        assert actions == plan_once(records.values(), nodes, quiet, now)
        records = apply_all(records, actions, now)
        for a in actions:
            planner.observe(records[a.job_id])
        # Some runs end, some interrupted ones release their nodes.
        for job_id, r in list(records.items()):
            if r.state.holds_nodes and rng.random() < 0.4:
                for node in r.nodes:
                    r = transitions.apply_event(r, _exited(r, node, now), now) or r
                records[job_id] = r
                planner.observe(r)
        now += rng.choice((1.0, 50.0, 200.0))


def _exited(r: JobRecord, node: str, now: float):
    from hfai.protocol.types import RunEvent, RunEventKind

    return RunEvent(job_id=r.id, run_id=r.run_id, node=node, event=RunEventKind.EXITED, ts=now, exit_code=0)


# ------------------------------------------------------------------------ priorities honoured


class _Watched(Simulator):
    """Checks after every round: the first waiting job of the highest priority, in the policy's
    own queue order (for hfai's: service band, then submit time; a job suspended by a time slice
    lines up behind its level's jobs that ran less), if free nodes and nodes of lower-priority
    running jobs could hold it, started or has nodes being released."""

    violations: list[str]

    def round(self) -> None:
        super().round()
        records = self.planner.records
        waiting = [r for r in records.values() if r.state.waiting]
        if not waiting:
            return
        prio = {r.id: effective_priority(job_view(r), self.now, self.config.policy) for r in records.values()}
        queued = self.policy.ordering(self.config.policy).key
        head = min(waiting, key=lambda r: (-prio[r.id], queued(job_view(r)), r.id))
        free = self.n - sum(len(r.nodes) for r in records.values() if r.state.holds_nodes)
        lower = sum(len(r.nodes) for r in records.values()
                    if r.state is ChainState.RUNNING and prio[r.id] < prio[head.id])
        leaving = any(r.state is ChainState.SUSPENDING for r in records.values())
        if free + lower >= head.spec.nodes and not leaving:
            self.violations.append(f"t={self.now}: {head.id} (priority {prio[head.id]}) waits with "
                                   f"{free} free and {lower} lower-priority nodes")


@pytest.mark.parametrize("name", ["hfai", "las-prio"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10_000), st.integers(2, 8))
def test_a_waiting_higher_priority_job_never_waits_while_a_lower_one_runs_on_its_nodes(name, seed, n_nodes):
    """hfai's policy, and the LAS baseline bound by priorities that the benchmark measures it against."""
    rng = random.Random(seed)
    trace = sorted((TraceJob(rng.uniform(0, 3000), rng.uniform(30, 2000), rng.randint(1, n_nodes),
                             rng.choice((LOW, NORMAL, HIGH, Priority.VERY_HIGH.value)), rng.choice("abc"))
                    for _ in range(rng.randint(1, 25))), key=lambda j: j.submit_s)
    from hfai.sim import POLICIES

    sim = _Watched(trace, n_nodes, POLICIES[name], SimConfig(checkpoint_s=20.0, restart_s=10.0, tick_s=5.0,
                                                             wake_s=30.0, policy=PolicyConfig(slice_s=300.0)), name)
    sim.violations = []
    result = sim.run()
    assert result.jobs == len(trace)
    assert sim.violations == []


@pytest.mark.parametrize("name, trace", [
    # FIFO lets a LOW job hold the node a HIGH one waits for.
    ("fifo", [TraceJob(0.0, 1000.0, 1, LOW, "a"), TraceJob(10.0, 10.0, 1, HIGH, "b")]),
    # LAS without priorities takes the node from a HIGH job that ran an hour for a LOW one that has not.
    ("las", [TraceJob(0.0, 8000.0, 1, HIGH, "a"), TraceJob(4000.0, 1000.0, 1, LOW, "b")]),
])
def test_the_watch_would_see_a_policy_that_ignores_priorities(name, trace):
    """The property above can fail."""
    from hfai.sim import POLICIES

    sim = _Watched(trace, 1, POLICIES[name], SimConfig(tick_s=5.0, wake_s=30.0), name)
    sim.violations = []
    sim.run()
    assert sim.violations


def test_simulated_and_leader_records_go_through_the_same_transitions():
    """Run time is counted at requeue (transitions.requeue), checkpoint included, in the
    simulator as live; and a job's group comes from its record."""
    cfg = SimConfig(checkpoint_s=50.0, restart_s=0.0, tick_s=1.0, wake_s=5.0, policy=PolicyConfig(slice_s=1800.0))
    trace = [TraceJob(0.0, 1000.0, 1, LOW, "a"), TraceJob(100.0, 10.0, 1, HIGH, "b")]
    from hfai.controller.policy import HFAI

    sim = Simulator(trace, 1, HFAI, cfg, "hfai")
    seen: list[JobRecord] = []
    original = sim.planner.observe

    def spy(record: JobRecord) -> None:
        seen.append(record)
        original(record)

    sim.planner.observe = spy  # type: ignore[method-assign]
    sim.run()
    requeued = next(r for r in seen if r.id == "j0000000" and r.state is ChainState.SUSPENDED)
    assert requeued.run_s == pytest.approx(100.0 + 50.0)  # ran 100 s, then checkpointed 50 s
    assert requeued.spec.group == "default"


def test_sync_follows_a_bucket_changes_finals_and_purges():
    planner = Planner()
    a, b = rec("a"), rec("b", ChainState.RUNNING, nodes=("n0",))
    bucket = {"a": a, "b": b}
    planner.sync(bucket)
    assert set(planner.records) == {"a", "b"}
    done = transitions.apply_event(b, _exited(b, "n0", NOW), NOW)
    bucket["b"] = done
    planner.sync(bucket)
    assert set(planner.records) == {"a"} and planner.ended == {"b": ChainState.SUCCEEDED}
    del bucket["a"]  # purged
    planner.sync(bucket)
    assert planner.records == {} and planner.index is None or len(planner.index or ()) == 0
    # A fresh planner given the same bucket knows the same.
    fresh = Planner()
    fresh.sync(bucket)
    assert fresh.records == planner.records and fresh.ended == planner.ended


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_catching_up_on_changed_keys_is_a_full_sync(history):
    """The leader feeds its planner only the keys that changed since the last round
    (Planner.sync_keys); a planner synced on the whole bucket every round must agree."""
    n_nodes, seed, rounds = history
    rng = random.Random(seed)
    nodes = cluster(n_nodes)
    full, keyed = Planner(), Planner()
    records: dict[str, JobRecord] = {}
    now = 1000.0
    for k in range(rounds):
        changed: set[str] = set()
        for _ in range(rng.randrange(4)):
            job_id = f"j{k}-{rng.randrange(10**6)}"
            records[job_id] = rec(job_id, user=rng.choice("abc"), n=rng.randint(1, n_nodes), submit=now)
            changed.add(job_id)
        for job_id, r in list(records.items()):
            roll = rng.random()
            if r.state.holds_nodes and roll < 0.4:
                for node in r.nodes:
                    r = transitions.apply_event(r, _exited(r, node, now), now) or r
                records[job_id] = r
                changed.add(job_id)
            elif r.state.final and roll < 0.3:
                del records[job_id]  # purged after its retention
                changed.add(job_id)
        full.sync(records)
        keyed.sync_keys(records, changed)
        assert keyed.records == full.records and keyed.ended == full.ended
        settings_ = PlanSettings(policy=PolicyConfig(explain_waits=False))
        actions = full.plan(nodes, settings_, now)
        assert keyed.plan(nodes, settings_, now) == actions
        records = apply_all(records, actions, now)
        changed = {a.job_id for a in actions}
        full.sync(records)
        keyed.sync_keys(records, changed)
        now += 50.0


def test_master_ports_stay_distinct_per_address_across_rounds():
    """Runs whose first node shares an address never get the same MASTER_PORT, also when
    started in different rounds; a run that ended frees its port. (a, c and e would all pick
    the same port first: their run ids hash alike.)"""
    nodes = [PlanNode(f"n{i}", address="10.0.0.9") for i in range(2)]
    two_ports = PlanSettings(policy=PolicyConfig(explain_waits=False), master_port_base=29500, master_port_span=2)
    planner = Planner()
    records = {"a": rec("a")}
    planner.observe(records["a"])

    def round_(now: float) -> list[StartRun]:
        nonlocal records
        actions = planner.plan(nodes, two_ports, now)
        records = apply_all(records, actions, now)
        for a in actions:
            planner.observe(records[a.job_id])
        return [a for a in actions if isinstance(a, StartRun)]

    assert [a.job_id for a in round_(NOW)] == ["a"]
    records["c"] = rec("c", submit=1.0)
    planner.observe(records["c"])
    assert [a.job_id for a in round_(NOW + 1)] == ["c"]
    assert {records["a"].master_port, records["c"].master_port} == {29500, 29501}
    free_after_a = records["a"].master_port
    records["a"] = transitions.ranks_exited(records["a"], NOW + 2)  # a ends
    planner.observe(records["a"])
    records["e"] = rec("e", submit=2.0)
    planner.observe(records["e"])
    assert [(a.job_id, a.master_port) for a in round_(NOW + 3)] == [("e", free_after_a)]
