"""What any policy within hfai's rules could at best get from a trace with speedup curves: a
fluid replay that knows every job's curve, reallocates nodes at every arrival and end at no
cost, and is bound only by node granularity (bench/bench_elastic.py prints it).

At every arrival and end, the jobs present each get their smallest size (``lo``) in order (those
that do not fit wait), then the nodes left go one at a time to the job whose next node adds the
most throughput, weighted by how urgent the job is:

* **clairvoyant**: it also knows every job's duration. Jobs are taken shortest remaining time
  first (at their best size), and a node's gain is weighted by ``1 / sqrt(work left)``: the
  shortest-remaining-time-first rule generalised to jobs that scale (sqrt did best of the
  powers 0.5 to 3 on the Pollux-derived traces, within 3%). No policy that does not know
  durations (hfai's does not: rule 7 orders by attained service) can be expected to beat it.
* **blind**: it knows the curves, not the durations. Jobs are taken least attained service
  first (Tiresias's LAS, continuous: no bands, reallocated every minute), and a node's gain is weighted by
  ``1 / (service + 1 node-hour)``. That is an upper bound for what curves and instant,
  free resizes add to LAS's order; hfai's slices, restarts and service bands cost more.

Neither pays restarts, checkpoints or a slice's wait: they are bounds to read a policy's
figures against, not policies (nothing here is a :class:`~hfai.controller.policy.Policy`).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence

from hfai.sim.trace import TraceJob

#: The blind order's offset: a job's first node-hour of service weighs as much as its gain.
BLIND_OFFSET_S = 3600.0
#: How often the blind one reallocates between arrivals and ends (attained service changes as
#: jobs run: LAS's order is not fixed between events).
BLIND_QUANTUM_S = 60.0
#: The blind order's service bands (node-seconds of work done), LAS's and hfai's: FIFO within a band.
BLIND_BANDS_S = (3600.0, 8 * 3600.0, 64 * 3600.0)


def fluid_jct(trace: Sequence[TraceJob], nodes: int, clairvoyant: bool = True,
              quantum_s: float = BLIND_QUANTUM_S) -> list[float]:
    """Each job's completion time (end minus submit, seconds) in the fluid replay; the blind one
    also reallocates every ``quantum_s``, as attained service changes."""
    n = len(trace)
    lo = [t.nodes for t in trace]
    hi = [max(t.nodes, t.max_nodes) for t in trace]
    work = [t.work for t in trace]
    arrivals = sorted(range(n), key=lambda i: (trace[i].submit_s, i))
    left: dict[int, float] = {}
    end = [0.0] * n
    now, k = 0.0, 0
    while k < n or left:
        if not left:
            now = max(now, trace[arrivals[k]].submit_s)
        while k < n and trace[arrivals[k]].submit_s <= now:
            left[arrivals[k]] = work[arrivals[k]]
            k += 1

        def urgency(i: int) -> float:
            if clairvoyant:
                return 1.0 / math.sqrt(left[i])
            return 1.0 / (work[i] - left[i] + BLIND_OFFSET_S)

        def order(i: int) -> tuple[float, ...]:
            if clairvoyant:
                return (left[i] / trace[i].rate(hi[i]), i)
            return (bisect.bisect_right(BLIND_BANDS_S, work[i] - left[i]), trace[i].submit_s, i)

        alloc: dict[int, int] = {}
        free = nodes
        for i in sorted(left, key=order):
            if lo[i] <= free:
                alloc[i] = lo[i]
                free -= lo[i]
        heap = [(-(trace[i].rate(s + 1) - trace[i].rate(s)) * urgency(i), i) for i, s in alloc.items() if s < hi[i]]
        heapq.heapify(heap)
        while free > 0 and heap:
            neg, i = heapq.heappop(heap)
            if neg >= 0:
                break  # no job gains from another node
            alloc[i] += 1
            free -= 1
            s = alloc[i]
            if s < hi[i]:
                heapq.heappush(heap, (-(trace[i].rate(s + 1) - trace[i].rate(s)) * urgency(i), i))
        due = trace[arrivals[k]].submit_s if k < n else math.inf
        finish = min(left[i] / trace[i].rate(s) for i, s in alloc.items())
        dt = min(due - now, finish, math.inf if clairvoyant else quantum_s)
        for i, s in alloc.items():
            left[i] -= dt * trace[i].rate(s)
        now += dt
        for i in [i for i in alloc if left[i] <= 1e-6 * max(1.0, work[i])]:
            del left[i]
            end[i] = now
    return [end[i] - trace[i].submit_s for i in range(n)]


def fluid_avg_jct(trace: Sequence[TraceJob], nodes: int, clairvoyant: bool = True,
                  quantum_s: float = BLIND_QUANTUM_S) -> float:
    """The average completion time (seconds) of :func:`fluid_jct`."""
    jct = fluid_jct(trace, nodes, clairvoyant, quantum_s)
    return sum(jct) / len(jct) if jct else 0.0
