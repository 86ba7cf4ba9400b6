"""The plan and node health (issue 35): nothing is ever placed on an unhealthy node, a faulted
node's runs are interrupted as a platform fault, and a job's next start avoids the node a fault
interrupted it on where another node is free. The nodes come from heartbeat records through the
controller's own inputs (controller/inputs.py::plan_nodes), as the leader builds them."""

from __future__ import annotations

import time
from types import SimpleNamespace

from hypothesis import HealthCheck as Hyp
from hypothesis import given, settings
from hypothesis import strategies as st

from hfai.controller.inputs import plan_nodes
from hfai.controller.nodes import NodeTracker
from hfai.controller.plan import Interrupt, PlanSettings, StartRun, plan_once
from hfai.protocol import reasons
from hfai.protocol.reasons import ReasonCode
from hfai.protocol.types import ChainState, GpuFault, GpuStat, JobRecord, JobSpec, NodeRecord

NOW = 1_750_000_000.0
TIMEOUT_S = 30.0
FAULT = GpuFault(ts=NOW, why=reasons.gpu_fault(gpu=3, xid=79, meaning="fell off the bus", kind="hardware"),
                 hardware=True)
HEALTHS = ("ok", "ok", "fault", "fatal", "drained", "dead")


def _gpu(fatal: bool) -> GpuStat:
    return GpuStat(index=0, name="g", utilization=0.0, memory_used=0, memory_total=1, temperature=30.0, power_w=1.0,
                   fatal=fatal)


def _record(name: str, group: str, health: str) -> NodeRecord:
    return NodeRecord(name=name, group=group, address="10.0.0.1", ts=NOW, seq=1, gpus=(_gpu(health == "fatal"),),
                      fault=FAULT if health == "fault" else None, drain_reason="fan" if health == "drained" else "")


def _tracker(nodes: list[tuple[str, str, str]]) -> NodeTracker:
    """The leader's view of heartbeat records: a dead node's record was last seen long ago."""
    mono = time.monotonic()
    cache = SimpleNamespace(values={n: _record(n, g, h) for n, g, h in nodes},
                            seen={n: mono - (10 * TIMEOUT_S if h == "dead" else 0.0) for n, _, h in nodes})
    return NodeTracker(cache, TIMEOUT_S)  # type: ignore[arg-type]


def _job(i: int, group: str, state: ChainState, nodes: tuple[str, ...] = (), size: int = 1,
         avoid: tuple[str, ...] = ()) -> JobRecord:
    spec = JobSpec(name=f"j{i}", entrypoint=("x",), workdir="/", nodes=size, group=group, user=f"u{i % 3}")
    return JobRecord(id=f"j{i:02d}", spec=spec, state=state, submit_ts=NOW - 1000 + i, nodes=nodes,
                     run_id=1 if nodes else 0, started_ts=NOW - 100 if nodes else 0.0, avoid=avoid)


@st.composite
def clusters(draw):
    """Nodes of every health in two groups, jobs running on some of them, waiting jobs (some
    avoiding nodes)."""
    nodes = [(f"n{i}", draw(st.sampled_from(["g1", "g2"])), draw(st.sampled_from(HEALTHS)))
             for i in range(draw(st.integers(1, 8)))]
    free = list(nodes)
    jobs = []
    for i in range(draw(st.integers(0, 4))):
        if not free:
            break
        name, group, _ = free.pop(draw(st.integers(0, len(free) - 1)))
        jobs.append(_job(i, group, ChainState.RUNNING, (name,)))
    names = [n for n, _, _ in nodes]
    for i in range(10, 10 + draw(st.integers(0, 5))):
        avoid = tuple(draw(st.lists(st.sampled_from(names), max_size=2, unique=True)))
        jobs.append(_job(i, draw(st.sampled_from(["g1", "g2"])),
                         draw(st.sampled_from([ChainState.QUEUED, ChainState.SUSPENDED])), size=draw(st.integers(1, 2)),
                         avoid=avoid))
    return nodes, jobs


@settings(max_examples=300, deadline=None, suppress_health_check=[Hyp.too_slow])
@given(clusters())
def test_nothing_is_placed_on_an_unhealthy_node(cluster):
    nodes, jobs = cluster
    health = {n: h for n, _, h in nodes}
    actions = plan_once(jobs, plan_nodes(_tracker(nodes), jobs, led_s=0.0), PlanSettings(), NOW)
    for a in actions:
        if isinstance(a, StartRun):
            assert all(health[n] == "ok" for n in a.nodes), (a, health)
    # Every run on an alive node with a fault or fatal GPU is interrupted, with the fault's words.
    interrupted = {a.job_id: a for a in actions if isinstance(a, Interrupt)}
    for j in jobs:
        if j.state is ChainState.RUNNING and health[j.nodes[0]] in ("fault", "fatal"):
            a = interrupted[j.id]
            assert a.avoid == j.nodes[0] and a.decision.why.code == ReasonCode.GPU_ERROR
            if health[j.nodes[0]] == "fault":
                assert "Xid 79 on GPU 3: fell off the bus" in a.decision.why.text()


@settings(max_examples=300, deadline=None, suppress_health_check=[Hyp.too_slow])
@given(clusters())
def test_a_start_uses_an_avoided_node_only_when_no_other_healthy_node_of_its_group_is_free(cluster):
    nodes, jobs = cluster
    actions = plan_once(jobs, plan_nodes(_tracker(nodes), jobs, led_s=0.0), PlanSettings(), NOW)
    by_id = {j.id: j for j in jobs}
    group = {n: g for n, g, _ in nodes}
    taken = {n for j in jobs if j.state.holds_nodes for n in j.nodes}
    taken |= {n for a in actions if isinstance(a, StartRun) for n in a.nodes}
    unused = {n for n, _, h in nodes if h == "ok" and n not in taken}
    for a in actions:
        if not isinstance(a, StartRun):
            continue
        avoid = set(by_id[a.job_id].avoid)
        for n in set(a.nodes) & avoid:
            assert not {u for u in unused if group[u] == group[n] and u not in avoid}, (a, avoid, unused)


def test_a_job_interrupted_by_a_fault_restarts_on_another_node_and_forgets_the_avoidance():
    nodes = [("n0", "g1", "ok"), ("n1", "g1", "ok")]
    job = _job(1, "g1", ChainState.SUSPENDED, avoid=("n0",))
    [start] = plan_once([job], plan_nodes(_tracker(nodes), [job], 0.0), PlanSettings(), NOW)
    assert isinstance(start, StartRun) and start.nodes == ("n1",)
    assert start.apply(job, NOW).avoid == ()
    # Only the avoided node free: it is used (it is healthy again).
    only = [("n0", "g1", "ok"), ("n1", "g1", "drained")]
    [start] = plan_once([job], plan_nodes(_tracker(only), [job], 0.0), PlanSettings(), NOW)
    assert start.nodes == ("n0",)


def test_a_node_one_start_gives_up_for_its_avoided_one_is_free_for_the_next():
    """j10 avoids n1 and j11 avoids n3; the policy picks n1 and n3 for them (the first free nodes),
    leaving n6 spare. j10 takes n6 instead of n1, and n1, given up, serves j11 instead of n3."""
    nodes = [("n1", "g2", "ok"), ("n3", "g2", "ok"), ("n6", "g2", "ok")]
    jobs = [_job(10, "g2", ChainState.QUEUED, avoid=("n1",)), _job(11, "g2", ChainState.QUEUED, avoid=("n3",))]
    actions = plan_once(jobs, plan_nodes(_tracker(nodes), jobs, led_s=0.0), PlanSettings(), NOW)
    starts = {a.job_id: a.nodes for a in actions if isinstance(a, StartRun)}
    assert set(starts) == {"j10", "j11"}
    assert "n1" not in starts["j10"] and "n3" not in starts["j11"], starts
