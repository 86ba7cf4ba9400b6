"""Property tests of the policy: safety of every single decision on random cluster states, and
liveness over whole replays (every job, so every job of the highest waiting priority, runs)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfai.controller.policy import ANY, HFAI, JobView, NodeView, PolicyConfig, Quotas, Start, Suspend, Wait, decide
from hfai.protocol.types import ChainState, Priority
from hfai.sim import SimConfig, Simulator, TraceJob

PRIOS = [Priority.LOW.value, Priority.NORMAL.value, Priority.ABOVE_NORMAL.value, Priority.HIGH.value]
USERS = ["a", "b", "c"]
NOW = 10_000.0
#: Time run in earlier runs: different service bands at a 30 min slice.
SERVICE = st.sampled_from([0.0, 2000.0, 20_000.0, 300_000.0])


@st.composite
def cluster_states(draw):
    """Nodes in two groups (some down), running/suspending jobs on disjoint nodes, waiting jobs,
    and quotas that the running jobs respect."""
    n_nodes = draw(st.integers(1, 10))
    node_views = [NodeView(f"n{i}", draw(st.sampled_from(["g1", "g2"])), draw(st.booleans()) or i % 3 != 0)
                  for i in range(n_nodes)]
    limit = draw(st.none() | st.integers(1, 6))
    quotas = Quotas({} if limit is None else {(ANY, p, ANY): limit for p in PRIOS})
    free = list(node_views)
    used: Counter = Counter()  # per (user, priority, group)
    jobs: list[JobView] = []
    for i in range(draw(st.integers(0, 6))):
        group = draw(st.sampled_from(["g1", "g2"]))
        pool = [n for n in free if n.group == group]
        size = draw(st.integers(1, 3))
        user, prio = draw(st.sampled_from(USERS)), draw(st.sampled_from(PRIOS))
        if len(pool) < size or (limit is not None and used[(user, prio, group)] + size > limit):
            continue
        held = tuple(n.name for n in pool[:size])
        free = [n for n in free if n.name not in held]
        used[(user, prio, group)] += size
        elastic = draw(st.booleans())
        jobs.append(JobView(
            f"r{i}", user, prio, size, draw(st.floats(0, NOW)),
            draw(st.sampled_from([ChainState.RUNNING, ChainState.RUNNING, ChainState.SUSPENDING])),
            group=group, held=held, started_ts=draw(st.floats(0, NOW)),
            min_nodes=1 if elastic else 0, max_nodes=size + 2 if elastic else 0, run_s=draw(SERVICE),
        ))
    for i in range(draw(st.integers(0, 8))):
        size = draw(st.integers(1, 4))
        elastic = draw(st.booleans())
        jobs.append(JobView(
            f"q{i}", draw(st.sampled_from(USERS)), draw(st.sampled_from(PRIOS)), size, draw(st.floats(0, NOW)),
            draw(st.sampled_from([ChainState.QUEUED, ChainState.SUSPENDED])), group=draw(st.sampled_from(["g1", "g2"])),
            slice_turns=draw(st.integers(0, 2)), min_nodes=1 if elastic else 0, max_nodes=size + 2 if elastic else 0,
            run_s=draw(SERVICE), queued_ts=draw(st.sampled_from([0.0, NOW - 10, NOW - 5000])),
        ))
    config = PolicyConfig(slice_s=draw(st.sampled_from([0.0, 1800.0, 600.0])), quotas=quotas,
                          above_normal_s=draw(st.sampled_from([0.0, float("inf")])))
    return jobs, node_views, config


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_states())
def test_quiet_rounds_decide_what_explaining_rounds_do(state):
    """The quiet walk (the simulator's, and the leader's between explanations) passes over jobs
    that could only be blocked, a list at a time; the explaining walk looks at every job. Both
    must start, preempt and reserve alike."""
    jobs, node_views, config = state
    loud = [d for d in decide(jobs, node_views, NOW, config) if not isinstance(d, Wait)]
    quiet = [d for d in decide(jobs, node_views, NOW, replace(config, explain_waits=False))
             if not isinstance(d, Wait)]
    assert quiet == loud


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster_states())
def test_one_decision_is_safe(state):
    jobs, node_views, config = state
    out = decide(jobs, node_views, NOW, config)
    by_id = {j.id: j for j in jobs}
    node_by_name = {n.name: n for n in node_views}
    busy = {n for j in jobs if j.state.holds_nodes for n in j.held}
    given_out: list[str] = []
    # A quota is per group; (ANY, p, ANY) is the default limit of every group, not a total.
    used = Counter((j.user, j.priority, j.group) for j in jobs if j.state.holds_nodes for _ in j.held)
    for d in out:
        job = by_id[d.job_id]
        if isinstance(d, Start):
            assert job.state.waiting
            # Gang: all of its nodes at once, within its range, on free usable nodes of its group.
            assert job.lo <= len(d.nodes) <= job.hi
            for name in d.nodes:
                assert name not in busy
                assert node_by_name[name].schedulable and node_by_name[name].group == job.group
            given_out.extend(d.nodes)
            used[(job.user, job.priority, job.group)] += len(d.nodes)
        elif isinstance(d, Suspend):
            assert job.state is ChainState.RUNNING  # never a job already leaving
            assert d.reason
    assert len(given_out) == len(set(given_out)), "a node was given to two jobs"
    suspended = [d.job_id for d in out if isinstance(d, Suspend)]
    assert len(suspended) == len(set(suspended)), "a job was preempted twice"
    for (user, prio, group), n in used.items():
        limit = config.quotas.limit(user, prio, group)
        assert limit is None or n <= limit, f"quota of {user} at {prio} exceeded: {n} > {limit}"


trace_jobs = st.builds(
    TraceJob,
    submit_s=st.floats(0, 5000),
    duration_s=st.floats(60, 20_000),
    nodes=st.integers(1, 4),
    priority=st.sampled_from(PRIOS),
    user=st.sampled_from(USERS),
    max_nodes=st.sampled_from([0, 0, 6]),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(trace_jobs, min_size=1, max_size=14), st.integers(4, 8), st.sampled_from([None, 4, 6]),
       st.sampled_from([600.0, 1800.0]))
def test_every_job_eventually_runs_and_nothing_is_ever_violated(trace, n_nodes, limit, slice_s):
    """The simulator checks each decision (no node twice, gang sizes, quotas) and fails if jobs
    wait on an idle cluster; that all jobs finish means each highest-priority waiter ran."""
    quotas = Quotas({} if limit is None else {(ANY, p, ANY): limit for p in PRIOS})
    config = SimConfig(checkpoint_s=30.0, restart_s=30.0, tick_s=10.0, wake_s=60.0,
                       policy=PolicyConfig(slice_s=slice_s, quotas=quotas, above_normal_s=3600.0))
    sim = Simulator(sorted(trace, key=lambda j: j.submit_s), n_nodes, HFAI, config, name="hfai")
    result = sim.run()
    assert result.jobs == len(trace)
    assert all(j.end >= j.trace.submit_s + j.trace.duration_s * j.trace.hi / max(j.trace.hi, 1) - 1e-6
               for j in sim.jobs)
    assert all(j.state is ChainState.SUCCEEDED for j in sim.jobs)


def test_an_over_quota_job_blocks_nobody_in_quiet_rounds_either():
    """Over quota, a job waits without a reservation (an elastic job may still grow into idle
    nodes); the quiet walk must not mistake it for a job blocked for want of nodes."""
    nodes = [NodeView(f"n{i}") for i in range(4)]
    grower = JobView("e", "v", Priority.NORMAL.value, 2, 0.0, ChainState.RUNNING, held=("n0", "n1"),
                     started_ts=NOW - 7200, min_nodes=1, max_nodes=4)
    # Much service already: it could not take e's nodes by time slicing either.
    over = JobView("w", "u", Priority.NORMAL.value, 3, 100.0, ChainState.SUSPENDED, run_s=1e6)
    config = PolicyConfig(quotas=Quotas({("u", Priority.NORMAL.value, ANY): 1}))
    loud = decide([grower, over], nodes, NOW, config)
    quiet = decide([grower, over], nodes, NOW, replace(config, explain_waits=False))
    assert [d.job_id for d in loud if isinstance(d, Suspend)] == ["e"]  # it grows: restarted on 4
    assert [d for d in loud if not isinstance(d, Wait)] == [d for d in quiet if not isinstance(d, Wait)]
