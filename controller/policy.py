"""The scheduling policy: one pure function from (jobs, nodes, now, config) to decisions.

It never touches NATS, clocks or files; the leader's executor applies what it returns, and the
trace simulator can run the very same function in virtual time.

Rules (docs/architecture.md, "Scheduling policy"):

1. Higher priority first; within a priority, fewer time-slice turns first (round-robin), then
   first-come-first-served by original submit time (a resumed job keeps its place).
2. Gang: a job gets all its nodes at once or waits; victims are whole jobs.
3. A job that does not fit takes the free nodes as a reservation (nothing behind it may use
   them), counts nodes that are already being released, and then preempts running jobs of lower
   priority - lowest priority first, most recently started first (least work lost).
4. Time slicing: a running job of the same priority but another user that has held its nodes
   for at least ``slice_s`` may be suspended for a waiting one. Never for the same user at the
   same priority; a job that just (re)started keeps its nodes for one slice.
5. Preemption happens only if it frees enough nodes for the waiting job, so nobody is
   interrupted for nothing; jobs already suspending are not asked twice.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Union

from hfai.protocol.types import ChainState, Priority


@dataclass(frozen=True)
class PolicyConfig:
    slice_s: float = 1800.0


@dataclass(frozen=True)
class JobView:
    """What the policy needs to know about a job."""

    id: str
    user: str
    priority: int
    nodes: int
    submit_ts: float
    state: ChainState
    group: str = "default"
    held: tuple[str, ...] = ()
    started_ts: float = 0.0
    slice_turns: int = 0


@dataclass(frozen=True)
class NodeView:
    name: str
    group: str = "default"
    schedulable: bool = True


@dataclass(frozen=True)
class Start:
    job_id: str
    nodes: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class Suspend:
    job_id: str
    reason: str
    for_job: str
    # True when the job yields to an equal-priority job (it then moves back in the round-robin).
    sliced: bool = False


@dataclass(frozen=True)
class Wait:
    job_id: str
    reason: str


Decision = Union[Start, Suspend, Wait]


def decide(jobs: Iterable[JobView], nodes: Iterable[NodeView], now: float, config: PolicyConfig) -> list[Decision]:
    """All decisions for this moment. Deterministic for the same inputs."""
    jobs = list(jobs)
    by_group: dict[str, list[NodeView]] = defaultdict(list)
    for n in nodes:
        by_group[n.group].append(n)
    busy = {name for j in jobs if j.state.holds_nodes for name in j.held}
    decisions: list[Decision] = []
    groups = sorted({j.group for j in jobs if j.state.waiting})
    for group in groups:
        decisions.extend(_decide_group(jobs, by_group.get(group, []), busy, group, now, config))
    return decisions


@dataclass
class _Pool:
    """Running jobs of one group that could still be chosen as victims, with quick totals."""

    victims_by_prio: dict[int, list[JobView]]
    nodes_by_prio: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    taken: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, running: list[JobView]) -> _Pool:
        by_prio: dict[int, list[JobView]] = defaultdict(list)
        for j in running:
            by_prio[j.priority].append(j)
        pool = cls(victims_by_prio=by_prio)
        for prio, js in by_prio.items():
            # Most recently started first: preempting it loses the least work.
            js.sort(key=lambda j: (-j.started_ts, j.id))
            pool.nodes_by_prio[prio] = sum(j.nodes for j in js)
        return pool

    def take(self, job: JobView) -> None:
        self.taken.add(job.id)
        self.nodes_by_prio[job.priority] -= job.nodes


def _decide_group(jobs: list[JobView], group_nodes: list[NodeView], busy: set[str], group: str, now: float,
                  config: PolicyConfig) -> list[Decision]:
    schedulable = sorted(n.name for n in group_nodes if n.schedulable)
    free = [n for n in schedulable if n not in busy]
    mine = [j for j in jobs if j.group == group]
    leaving = sum(
        sum(1 for n in j.held if n in schedulable)
        for j in mine
        if j.state in (ChainState.SUSPENDING, ChainState.STOPPING)
    )
    pool = _Pool.of([j for j in mine if j.state is ChainState.RUNNING])
    waiting = sorted((j for j in mine if j.state.waiting), key=lambda j: (-j.priority, j.slice_turns, j.submit_ts, j.id))
    out: list[Decision] = []
    for job in waiting:
        if job.nodes > len(schedulable):
            out.append(Wait(job.id, f"needs {job.nodes} nodes, group {group!r} has {len(schedulable)} usable"))
            continue
        if job.nodes <= len(free):
            out.append(Start(job.id, tuple(free[: job.nodes]), "nodes free"))
            free = free[job.nodes :]
            continue
        # Blocked: reserve what is free and what is being released, then look for victims.
        need = job.nodes - len(free)
        free = []
        from_leaving = min(need, leaving)
        leaving -= from_leaving
        need -= from_leaving
        if need <= 0:
            out.append(Wait(job.id, "waiting for nodes that are being released"))
            continue
        victims = _choose_victims(job, need, pool, now, config)
        if victims is None:
            out.append(Wait(job.id, f"waiting for {need} more node(s), held by jobs it may not preempt"))
            continue
        for v, sliced in victims:
            pool.take(v)
            if sliced:
                reason = f"time slice: yields to job {job.id} of equal priority after {(now - v.started_ts) / 60:.1f} min"
            else:
                reason = (f"preempted by job {job.id} (priority {Priority.label(job.priority)} > "
                          f"{Priority.label(v.priority)})")
            out.append(Suspend(v.id, reason, for_job=job.id, sliced=sliced))
        out.append(Wait(job.id, "waiting for preempted jobs to checkpoint and release their nodes"))
    return out


def _choose_victims(job: JobView, need: int, pool: _Pool, now: float,
                    config: PolicyConfig) -> list[tuple[JobView, bool]] | None:
    """Whole running jobs whose nodes add up to ``need``, cheapest first; None if impossible."""
    lower = sorted(p for p in pool.nodes_by_prio if p < job.priority)
    slice_ok = [
        v for v in pool.victims_by_prio.get(job.priority, ())
        if v.id not in pool.taken and v.user != job.user and now - v.started_ts >= config.slice_s
    ]
    available = sum(pool.nodes_by_prio[p] for p in lower) + sum(v.nodes for v in slice_ok)
    if available < need:
        return None
    chosen: list[tuple[JobView, bool]] = []
    for prio in lower:
        for v in pool.victims_by_prio[prio]:
            if v.id in pool.taken:
                continue
            chosen.append((v, False))
            need -= v.nodes
            if need <= 0:
                return chosen
    # Round-robin among equals: the one that has held its nodes longest yields first.
    for v in sorted(slice_ok, key=lambda v: (v.started_ts, v.id)):
        chosen.append((v, True))
        need -= v.nodes
        if need <= 0:
            return chosen
    return None
