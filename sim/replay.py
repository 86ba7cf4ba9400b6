"""Trace simulator: replay a job trace in virtual time through the leader's own plan.

The simulator is an executor of :class:`hfai.controller.plan.Planner`, exactly like the leader:
each round it applies the plan's actions to real ``JobRecord`` s with the same pure transitions
(controller/transitions.py), and plays the agents: a started run makes progress and its ranks
exit 0 when the work is done; an interrupted run acknowledges and exits after ``checkpoint_s``.
So run time, requeues, groups and restrictions are counted by the code the live cluster runs. It
also checks what the policy asks for (a node given twice, a gang started on the wrong number of
nodes or a quota exceeded raise :class:`PolicyViolation`). Policies (:data:`POLICIES`): ``hfai``
(the leader's :data:`~hfai.controller.policy.HFAI`) and the baselines ``fifo``, ``las`` and
``las-prio`` (sim/baselines.py).

Time model: the plan runs at most once per ``tick_s`` of virtual time (like the leader's
scheduling period, 1 s) and only when something happened since its last run, or every ``wake_s``
while jobs wait (time slices, priority decay and LAS demotions depend on the clock alone). An
interrupt costs ``checkpoint_s`` (the job holds its nodes but makes no progress) and ``restart_s``
at its next start (holding nodes, no progress). Work is ``duration_s`` at the job's largest size
(``max_nodes`` for an elastic job), done at the rate of its ``speedup`` curve on the nodes it
holds, one node-second per node per second without a curve (an elastic job at half size then
takes twice as long). A run's throughput at its size is known to the policy as soon as the run
starts (``JobRecord.throughput``, as a live job's runtime reports it a few times a minute): only
sizes a job ran at are measured, the rest the policy predicts.

Trace files: sim/trace.py; results and the table: sim/report.py.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from hfai.controller import transitions
from hfai.controller.plan import Explain, Interrupt, Planner, PlanNode, PlanSettings, StartRun
from hfai.controller.policy import HFAI, HFAI_GAIN, Policy, PolicyConfig
from hfai.protocol.errors import HfaiError, InvalidRequest
from hfai.protocol.types import ChainState, JobRecord, JobSpec, SizeRate
from hfai.sim.baselines import FIFO, LAS, LAS_PRIO
from hfai.sim.report import Sample, SimResult, jain, quantile
from hfai.sim.trace import TraceJob

#: The policies a replay can be run with, by name.
POLICIES: dict[str, Policy] = {p.name: p for p in (HFAI, HFAI_GAIN, FIFO, LAS, LAS_PRIO)}


class PolicyViolation(HfaiError):
    """A policy returned a decision the cluster cannot carry out (a bug in the policy)."""


@dataclass(frozen=True)
class SimConfig:
    checkpoint_s: float = 60.0
    restart_s: float = 60.0
    # The leader plans as soon as an event arrives and at least every schedule_interval_s (1 s):
    # a coarser grid would leave freed nodes idle until the next tick, under every policy alike
    # (at 30 s, about 2% of the node-time while work waits on the policy table's traces).
    tick_s: float = 1.0
    wake_s: float = 300.0
    # Skip the periodic rounds that cannot act: after a round that changed nothing, until the
    # plan's quiet_until (same results, fewer rounds; tests/test_sim_replay.py compares).
    skip_quiet: bool = True
    policy: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass
class _Work:
    """What the simulated agents know of a job beyond its record: the work left and the metrics."""

    trace: TraceJob
    work_left: float  # node-seconds
    progress_from: float = 0.0  # after the restart cost of this run
    first_start: float = -1.0
    end: float = -1.0
    interrupts: int = 0
    gen: int = 0  # bumps on every start/interrupt, so stale heap events are recognised
    state: ChainState = ChainState.QUEUED  # of its record


_ARRIVE, _FINISH, _RELEASE = 0, 1, 2


class Simulator:
    """One replay. ``run()`` returns the metrics; the checks on the policy happen as it goes."""

    def __init__(self, trace: Sequence[TraceJob], n_nodes: int, policy: Policy, config: SimConfig,
                 name: str = "", record: bool = False):
        if n_nodes < 1:
            raise InvalidRequest("the simulated cluster needs at least one node")
        too_big = next((t for t in trace if t.nodes > n_nodes), None)
        if too_big is not None:
            raise InvalidRequest(f"a trace job needs {too_big.nodes} nodes, the simulated cluster has {n_nodes}")
        self.policy, self.config, self.name, self.record = policy, config, name, record
        # Wait reasons are for people; the replay needs only what changes.
        self.settings = PlanSettings(policy=replace(config.policy, explain_waits=False))
        self.planner = Planner(policy)
        self.n = n_nodes
        self.nodes = [PlanNode(f"n{i:05d}") for i in range(n_nodes)]
        self.ids = [f"j{i:07d}" for i in range(len(trace))]
        self.jobs = [_Work(t, work_left=t.work) for t in trace]
        self.index = {job_id: i for i, job_id in enumerate(self.ids)}
        self.owner: dict[str, str] = {}
        self.used: dict[tuple[str, int, str], int] = {}
        self.events: list[tuple[float, int, int, int, int]] = []  # (t, seq, kind, job index, gen)
        self.seq = 0
        self.now = 0.0
        self.busy = 0
        self.waiting = 0
        self.util_busy = self.util_cap = self.overhead_node_s = self.busy_node_s = 0.0
        self.calls = 0
        self.samples: list[Sample] = []
        for i, t in enumerate(trace):
            self.push(t.submit_s, _ARRIVE, i, 0)

    def push(self, t: float, kind: int, i: int, gen: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, i, gen))

    # -- the clock

    def advance(self, t: float) -> None:
        """Integrate the metrics up to ``t``."""
        dt = t - self.now
        if dt > 0:
            self.busy_node_s += self.busy * dt
            if self.waiting:
                self.util_busy += self.busy * dt
                self.util_cap += self.n * dt
            self.now = t

    def run(self) -> SimResult:
        last_call = -math.inf
        quiet = -math.inf  # no round before this time can act unless a record changes
        while self.events or self.waiting:
            changed = False
            due = self.events[0][0] if self.events else math.inf
            # The plan runs on the scheduling grid: at the first tick at or after the next event,
            # or at the next wake-up while jobs wait, whichever is first.
            t_event = self.grid(due)
            t_wake = last_call + self.config.wake_s if self.waiting else math.inf
            # Wake-ups that would find nothing to do are passed over, on the same grid (the
            # same additions, so the same floating-point times as rounds held one by one).
            while t_wake < quiet and t_wake < t_event:
                t_wake += self.config.wake_s
            t = max(min(t_event, t_wake), self.now)
            while self.events and self.events[0][0] <= t:
                ev_t, _, kind, i, gen = heapq.heappop(self.events)
                self.advance(ev_t)
                changed |= self.apply_event(kind, i, gen)
            self.advance(t)
            if changed or t >= t_wake:
                acted = self.round()
                last_call = t
                quiet = (self.planner.quiet_until(self.settings, t) if self.config.skip_quiet and not acted
                         else -math.inf)
                if not self.events and self.waiting:
                    # Nothing runs and nothing will arrive: no later call can differ from this one.
                    raise PolicyViolation(f"{self.name}: {self.waiting} job(s) wait on an idle cluster at "
                                          f"t={t:.0f}s and the policy starts none")
        return self.result()

    def grid(self, t: float) -> float:
        """The first scheduling tick at or after ``t``."""
        if t == math.inf:
            return t
        tick = self.config.tick_s
        at = math.ceil(t / tick) * tick
        return at if at >= t else at + tick  # t/tick can round down to a tick before t

    # -- the agents

    def apply_event(self, kind: int, i: int, gen: int) -> bool:
        w = self.jobs[i]
        job_id = self.ids[i]
        if kind == _ARRIVE:
            t = w.trace
            elastic = t.max_nodes > t.nodes
            spec = JobSpec(name=job_id, entrypoint=(), workdir="", nodes=t.hi, priority=t.priority, user=t.user,
                           min_nodes=t.nodes if elastic else 0, max_nodes=t.max_nodes if elastic else 0)
            self.planner.observe(JobRecord(id=job_id, spec=spec, state=ChainState.QUEUED, submit_ts=t.submit_s,
                                           reason="queued"))
            self.waiting += 1
            return True
        if gen != w.gen:
            return False  # superseded by a later start or interrupt
        job = self.planner.records[job_id]
        if kind == _FINISH:
            w.work_left = 0.0
            w.end = self.now
        # Done, or (_RELEASE) the checkpoint is written: every rank acknowledges if asked, then exits.
        held = job.nodes
        job = transitions.ranks_exited(job, self.now)
        self.release(job, held)
        self.planner.observe(job)
        w.state = job.state
        if job.state.waiting:
            self.waiting += 1
        return True

    def release(self, job: JobRecord, held: tuple[str, ...]) -> None:
        for n in held:
            del self.owner[n]
        self.busy -= len(held)
        key = (job.spec.user, job.spec.priority, job.spec.group)
        self.used[key] -= len(held)

    # -- the executor

    def round(self) -> bool:
        """One round of the plan, carried out; whether it started or interrupted anything."""
        self.calls += 1
        acted = False
        for action in self.planner.plan(self.nodes, self.settings, self.now):
            if isinstance(action, StartRun):
                self.start(action)
            elif isinstance(action, Interrupt):
                self.interrupt(action)
            elif not isinstance(action, Explain):
                raise PolicyViolation(f"{self.name}: unexpected action {action!r}")
            acted = acted or not isinstance(action, Explain)
        if self.record:
            self.samples.append(Sample(self.now, self.busy, self.waiting))
        return acted

    def record_of(self, job_id: str) -> JobRecord:
        job = self.planner.records.get(job_id)
        if job is None:
            raise PolicyViolation(f"{self.name}: decision for unknown or finished job {job_id}")
        return job

    def start(self, a: StartRun) -> None:
        job = self.record_of(a.job_id)
        spec = job.spec
        lo = spec.min_nodes or spec.nodes
        if not job.state.waiting:
            raise PolicyViolation(f"{self.name}: start of {job.id}, which is {job.state.value}")
        if not lo <= len(a.nodes) <= max(spec.max_nodes, spec.nodes) or len(set(a.nodes)) != len(a.nodes):
            raise PolicyViolation(f"{self.name}: {job.id} started on {len(a.nodes)} node(s), needs {lo}..{spec.nodes}")
        for n in a.nodes:
            if n in self.owner:
                raise PolicyViolation(f"{self.name}: node {n} given to {job.id} while {self.owner[n]} holds it")
        key = (spec.user, spec.priority, spec.group)
        self.used[key] = self.used.get(key, 0) + len(a.nodes)
        limit = self.config.policy.quotas.limit(*key, spec.by_operator)
        if self.policy in (HFAI, HFAI_GAIN) and limit is not None and self.used[key] > limit:
            raise PolicyViolation(f"{self.name}: {job.id} exceeds the quota of {key}: {self.used[key]} > {limit}")
        after = a.apply(job, self.now)
        if after is None:
            raise PolicyViolation(f"{self.name}: start of {job.id} changed nothing")
        for n in a.nodes:
            self.owner[n] = job.id
        i = self.index[job.id]
        w = self.jobs[i]
        restart = self.config.restart_s if w.first_start >= 0 else 0.0
        if w.first_start < 0:
            w.first_start = self.now
        w.progress_from = self.now + restart
        w.gen += 1
        self.busy += len(a.nodes)
        self.waiting -= 1
        self.overhead_node_s += restart * len(a.nodes)
        size = len(a.nodes)
        self.push(w.progress_from + w.work_left / w.trace.rate(size), _FINISH, i, w.gen)
        if all(r.nodes != size for r in after.throughput):  # measured: the runtime reports it
            after = replace(after, throughput=(*after.throughput, SizeRate(size, w.trace.rate(size))))
        self.planner.observe(after)
        w.state = after.state

    def interrupt(self, a: Interrupt) -> None:
        job = self.record_of(a.job_id)
        after = a.apply(job, self.now)
        if after is None:
            return  # like the leader: only a running job can be interrupted
        i = self.index[job.id]
        w = self.jobs[i]
        done = max(0.0, self.now - w.progress_from) * w.trace.rate(len(job.nodes))
        w.work_left = max(w.work_left - done, 1e-6)
        w.interrupts += 1
        w.gen += 1
        self.overhead_node_s += self.config.checkpoint_s * len(job.nodes)
        self.push(self.now + self.config.checkpoint_s, _RELEASE, i, w.gen)
        self.planner.observe(after)
        w.state = after.state

    # -- metrics

    def result(self) -> SimResult:
        jct = sorted(w.end - w.trace.submit_s for w in self.jobs)
        n = len(jct)
        per_user: dict[str, list[float]] = {}
        for w in self.jobs:
            ran, total = per_user.setdefault(w.trace.user, [0.0, 0.0])
            per_user[w.trace.user] = [ran + w.trace.duration_s, total + w.end - w.trace.submit_s]
        shares = [ran / total for ran, total in per_user.values() if total > 0]
        return SimResult(
            policy=self.name, nodes=self.n, jobs=n, makespan_s=self.now,
            utilisation=self.util_busy / self.util_cap if self.util_cap else 1.0,
            overhead=self.overhead_node_s / self.busy_node_s if self.busy_node_s else 0.0,
            avg_jct_s=sum(jct) / n, median_jct_s=quantile(jct, 0.5), p99_jct_s=quantile(jct, 0.99),
            avg_queue_s=sum(w.first_start - w.trace.submit_s for w in self.jobs) / n,
            p99_queue_s=quantile(sorted(w.first_start - w.trace.submit_s for w in self.jobs), 0.99),
            interrupts_per_job=sum(w.interrupts for w in self.jobs) / n,
            fairness=jain(shares), decisions=self.calls, samples=self.samples,
        )


def simulate(trace: Sequence[TraceJob], n_nodes: int, policy: str = "hfai", config: SimConfig | None = None,
             record: bool = False) -> SimResult:
    """Replay ``trace`` on ``n_nodes`` nodes with the named policy (see :data:`POLICIES`)."""
    if policy not in POLICIES:
        raise InvalidRequest(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    return Simulator(trace, n_nodes, POLICIES[policy], config or SimConfig(), name=policy, record=record).run()
