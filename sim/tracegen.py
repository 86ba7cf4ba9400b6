"""Synthetic job traces for the simulator: Poisson arrivals at a chosen offered load.

Durations follow a bounded Pareto law from one minute to four days (shape 0.3: median about
8 minutes, mean about 3.3 hours, so a few long jobs hold most of the node-time, as in published
GPU-cluster traces); node counts are 1-64, mostly small; users are Zipf-distributed and priorities
mostly NORMAL. The arrival rate is set so that the expected demand, in node-seconds per second,
is ``load`` times the cluster size (``load`` > 1: more work arrives than the cluster can run).
The arrival times are then stretched so that the trace's own demand is ``load``, not only its
expectation: with durations this heavy-tailed one finite trace strays far from it (1.36 was
reported for ``--load 1.2``).
"""

from __future__ import annotations

import random
from dataclasses import replace

from hfai.protocol.types import Priority
from hfai.sim.trace import TraceJob

MIN_S, MAX_S, SHAPE = 60.0, 4 * 86400.0, 0.3

#: (nodes, weight): most jobs are small, a few are large gangs.
NODE_MIX = ((1, 50), (2, 15), (4, 15), (8, 10), (16, 6), (32, 3), (64, 1))

#: (priority, weight).
PRIORITY_MIX = (
    (Priority.LOW, 5), (Priority.BELOW_NORMAL, 5), (Priority.NORMAL, 70),
    (Priority.ABOVE_NORMAL, 10), (Priority.HIGH, 8), (Priority.VERY_HIGH, 2),
)


def mean_duration_s(lo: float = MIN_S, hi: float = MAX_S, shape: float = SHAPE) -> float:
    """Mean of the bounded Pareto law the durations are drawn from."""
    a = shape
    norm = a * lo ** a / (1 - (lo / hi) ** a)
    return norm * (hi ** (1 - a) - lo ** (1 - a)) / (1 - a)


def draw_duration(rng: random.Random, lo: float = MIN_S, hi: float = MAX_S, shape: float = SHAPE) -> float:
    """Inverse-CDF sample of the bounded Pareto law."""
    u = rng.random()
    ratio = (lo / hi) ** shape
    return lo / (1 - u * (1 - ratio)) ** (1 / shape)


def generate(jobs: int, nodes: int, load: float = 1.2, seed: int = 0, users: int = 8,
             elastic: float = 0.0, max_nodes: int = 64) -> list[TraceJob]:
    """``jobs`` jobs for a cluster of ``nodes`` nodes at offered ``load``. A fraction ``elastic``
    of the multi-node jobs may run on half to all of their nodes (``MIN:MAX``)."""
    if jobs < 1 or nodes < 1 or load <= 0 or users < 1 or not 0 <= elastic <= 1:
        raise ValueError("jobs, nodes, load and users must be positive and elastic in [0, 1]")
    rng = random.Random(seed)
    mix = [(n, w) for n, w in NODE_MIX if n <= min(max_nodes, nodes)]
    sizes, size_w = zip(*mix, strict=True)
    mean_nodes = sum(n * w for n, w in mix) / sum(size_w)
    rate = load * nodes / (mean_nodes * mean_duration_s())  # jobs per second
    prios, prio_w = zip(*PRIORITY_MIX, strict=True)
    names = [f"user{i:02d}" for i in range(users)]
    user_w = [1 / (i + 1) for i in range(users)]
    out: list[TraceJob] = []
    t = 0.0
    for _ in range(jobs):
        t += rng.expovariate(rate)
        n = rng.choices(sizes, size_w)[0]
        lo, hi = n, 0
        if n > 1 and rng.random() < elastic:
            lo, hi = max(1, n // 2), n
        out.append(TraceJob(
            submit_s=round(t, 3), duration_s=round(draw_duration(rng), 3), nodes=lo,
            priority=int(rng.choices(prios, prio_w)[0]), user=rng.choices(names, user_w)[0], max_nodes=hi,
        ))
    return at_load(out, nodes, load)


def at_load(trace: list[TraceJob], nodes: int, load: float) -> list[TraceJob]:
    """``trace`` with its arrival times scaled so that :func:`offered_load` is ``load`` (to the
    rounding of times to milliseconds). A Poisson process scaled in time is still one, at another
    rate; durations, sizes, users and the order of arrivals stay as drawn."""
    if len(trace) < 2 or trace[-1].submit_s <= trace[0].submit_s:
        return trace
    factor = offered_load(trace, nodes) / load
    return [replace(j, submit_s=round(j.submit_s * factor, 3)) for j in trace]


def offered_load(trace: list[TraceJob], nodes: int) -> float:
    """The trace's actual demand over its arrival span, as a multiple of the cluster's capacity."""
    span = max(trace[-1].submit_s - trace[0].submit_s, 1.0)
    return sum(j.duration_s * j.hi for j in trace) / (nodes * span)
