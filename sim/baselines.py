"""Baseline policies the simulator measures hfai against: each a
:class:`~hfai.controller.policy.Policy`, as hfai's own is, reading the same kind of job index (so
each round costs what it touches, not the length of the queue):

* ``fifo``: strict first-come-first-served by submit time, no preemption, no backfill: the head
  of the line blocks everyone behind it.
* ``las``: discretized least-attained-service in the style of Tiresias: queue k holds jobs whose
  attained service (node-seconds run) is below ``thresholds_node_s[k]``; lower queues first, FIFO
  within a queue; every round the jobs that fit in that order (skipping those that do not) should
  run, and running jobs outside that set are suspended. It ignores priorities.
* ``las-prio``: the same LAS with priorities first (a class per (priority, queue)): the peer that
  keeps the rule hfai must keep, so that a comparison with it shows the policy, not the price of
  honouring priorities.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Sequence

from hfai.controller.policy import (
    QUIET_MARGIN_S,
    Decision,
    FunctionPolicy,
    JobView,
    NodeView,
    Policy,
    PolicyConfig,
    Start,
    Suspend,
    indexed,
)
from hfai.controller.queues import GroupJobs, JobIndex, Ordering
from hfai.protocol import reasons
from hfai.protocol.types import Priority

#: Above every priority a job can have (ranks LAS classes by priority first).
_TOP = max(Priority) + 1

FIFO_ORDER = Ordering(("fifo",), lambda v: 0, lambda v: v.submit_ts)


def fifo_decide(jobs: Iterable[JobView] | JobIndex, nodes: Iterable[NodeView], now: float,
                config: PolicyConfig) -> list[Decision]:
    """Strict FIFO by submit time, no preemption, no backfill: the head of the line blocks."""
    index = indexed(jobs, FIFO_ORDER)
    free_by_group = index.free_nodes(nodes)
    out: list[Decision] = []
    for group in sorted(index.groups):
        g = index.groups[group]
        free = free_by_group.get(group, [])
        fi = 0
        lists = [keys for level in g.levels.values() for keys in level.lists.values()]
        head = index.get(min(lists)[0][1]) if lists else None  # lists compare by their heads first
        if head is None or head.lo > len(free):
            continue  # the head of the line does not fit: the common case, without a merge
        for _, job_id in heapq.merge(*lists):
            job = index.get(job_id)
            assert job is not None
            if job.lo > len(free) - fi:
                break
            out.append(Start(job.id, tuple(free[fi:fi + job.lo]), "fifo: head of the line fits"))
            fi += job.lo
    return out


#: FIFO decides by the records alone: the clock never changes its mind.
FIFO: Policy = FunctionPolicy("fifo", fifo_decide, lambda config: FIFO_ORDER, lambda jobs, now, config: math.inf)


def make_las(thresholds_node_s: Sequence[float] = (3600.0, 8 * 3600.0, 64 * 3600.0), *,
             by_priority: bool = False) -> Policy:
    """A LAS policy with these queue thresholds (node-seconds of attained service). With
    ``by_priority`` it honours priorities as hfai must: a higher priority always goes first and
    may preempt a lower one; LAS orders the jobs within one priority."""
    limits = sorted(thresholds_node_s)
    per_priority = len(limits) + 1

    def queue_of(v: JobView, now: float) -> int:
        ran = v.run_s + (now - v.started_ts if v.state.holds_nodes else 0.0)
        return bisect.bisect_right(limits, ran * v.size)

    def rank(v: JobView, q: int) -> int:
        """The job's place in the order of classes (lower first): its queue, after its priority."""
        return (_TOP - v.priority) * per_priority + q if by_priority else q

    # A waiting job's attained service does not change while it waits: its class is its level.
    order = Ordering(("las", tuple(limits), by_priority), lambda v: -rank(v, queue_of(v, 0.0)),
                     lambda v: v.submit_ts)
    # The running jobs' classes as of the last round, each with when it next changes: a running
    # job moves to the next queue only when its service crosses a threshold (kept per view, so a
    # changed record is worked out again; a small margin keeps clear of rounding at the crossing).
    known: dict[str, tuple[JobView, int, float]] = {}

    def class_now(v: JobView, now: float) -> tuple[JobView, int, float]:
        """(view, its class now, until when at least)."""
        seen = known.get(v.id)
        if seen is None or seen[0] is not v or now >= seen[2]:
            k = queue_of(v, now)
            until = v.started_ts + limits[k] / v.size - v.run_s - QUIET_MARGIN_S if k < len(limits) else math.inf
            seen = known[v.id] = (v, rank(v, k), until)
        return seen

    def running_queues(index: JobIndex, group: str, now: float) -> dict[int, list[JobView]]:
        """The group's running jobs by class; kept on the index until a job holding nodes
        changes or the first of them crosses a threshold."""
        memo = index.memo.get(("las", group))
        if memo is not None and memo[0] == index.holders_changed and memo[1] <= now < memo[2]:
            return memo[3]
        queues: dict[int, list[JobView]] = {}
        soonest = math.inf
        for v in index.groups[group].running.values():
            seen = known.get(v.id)  # class_now's check, inline: this loop runs every few rounds
            if seen is None or seen[0] is not v or now >= seen[2]:
                seen = class_now(v, now)
            here = queues.get(seen[1])
            if here is None:
                queues[seen[1]] = [v]
            else:
                here.append(v)
            if seen[2] < soonest:
                soonest = seen[2]
        index.memo[("las", group)] = (index.holders_changed, now, soonest, queues)
        return queues

    def las_decide(jobs: Iterable[JobView] | JobIndex, nodes: Iterable[NodeView], now: float,
                   config: PolicyConfig) -> list[Decision]:
        index = indexed(jobs, order)
        free_by_group = index.free_nodes(nodes)
        usable = index.layout(nodes).usable
        out: list[Decision] = []
        for group in sorted(index.groups):
            out.extend(_las_group(index.groups[group], running_queues(index, group, now), free_by_group.get(group, []),
                                  len(usable.get(group, ())), now))
        if len(known) > 4 * len(index) + 64:  # forget jobs that stopped running
            for job_id in [k for k in known if k not in index]:
                del known[job_id]
        return out

    def quiet_until(jobs: JobIndex, now: float, config: PolicyConfig) -> float:
        """When a running job's attained service reaches the next queue's threshold, the
        earliest (waiting jobs' service does not change): see Policy.quiet_until."""
        return min((class_now(v, now)[2] for g in jobs.groups.values() for v in g.running.values()),
                   default=math.inf)

    return FunctionPolicy("las-prio" if by_priority else "las", las_decide, lambda config: order, quiet_until)


def _las_group(g: GroupJobs, running: dict[int, list[JobView]], free: list[str], usable: int,
               now: float) -> list[Decision]:
    # Nodes of jobs being suspended count as capacity: they are free once the checkpoint is done.
    cap = [usable]  # a cell: the merge of waiting jobs reads the current value
    fi = 0
    out: list[Decision] = []
    for q in sorted(set(running) | {-level for level in g.levels}):
        here = running.get(q, [])
        level = g.levels.get(-q)
        waiting = level.fitting(lambda: cap[0]) if level is not None else iter(())
        w, _ = next(waiting, (None, False))
        if w is None:
            total = sum(r.size for r in here)
            if total <= cap[0]:  # nothing of this queue waits and all of it still fits: it stays
                cap[0] -= total
                continue
        here.sort(key=lambda j: (j.submit_ts, j.id))
        ri = 0
        while w is not None or ri < len(here):
            r = here[ri] if ri < len(here) else None
            if r is not None and (w is None or (r.submit_ts, r.id) < (w.submit_ts, w.id)):
                ri += 1
                if r.size <= cap[0]:
                    cap[0] -= r.size
                else:
                    out.append(Suspend(r.id, reasons.text(text=f"las: class {q} yields to jobs with less "
                                                                 f"attained service"), for_job=""))
                continue
            assert w is not None
            if w.lo <= cap[0]:  # the cap may have shrunk since the merge offered it
                cap[0] -= w.lo
                if w.lo <= len(free) - fi:
                    out.append(Start(w.id, tuple(free[fi:fi + w.lo]), f"las: class {q}"))
                    fi += w.lo
            w, _ = next(waiting, (None, False))
    return out


LAS = make_las()
LAS_PRIO = make_las(by_priority=True)


