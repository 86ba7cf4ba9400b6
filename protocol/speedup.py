"""A job's speedup curve, fitted to the throughput it was measured at (pure).

The model is Pollux's throughput model reduced to what a node count decides: the time of one
step of a fixed global batch on ``n`` nodes is

    t(n) = A * (1/n + serial + sync * (n - 1))

``1/n`` is the computation each node shares, ``serial`` what does not shrink with more nodes
(Amdahl's law: ``sync = 0``), ``sync`` the cost of synchronising one more node, which makes the
throughput fall again past some size. The relative speedup is ``t(1) / t(n)``.

The fit: least squares on the logarithm of the measured rates over a small grid of (serial,
sync), with ``A`` solved in closed form, plus a weak prior that pulls towards a serial fraction
(``PolicyConfig.prior_serial``, 0 by default) and no sync cost, so a job measured at one size
(or none) is assumed to scale as the prior says until it has shown otherwise: that is how sizes
not yet seen are predicted. Nor is a curve fitted that peaks between two measured sizes, well
above both: a job as fast on 1 node as on 4 is flat, not fastest on 2 (a sync cost can bend a
curve so, and the prior, which weighs a huge serial fraction more than a sync cost, would prefer
it). The default prior is linear, what the ``hfai`` policy assumes of every
job: a job without measurements at two sizes is sized exactly as ``hfai`` sizes it (bench/bench_elastic.py: a
5% serial prior shortened the Pollux-derived traces' average JCT by up to 8% more, but made
traces without curves worse by 1-4%, with twice the interruptions). Rates are whatever
unit the job reported (steps, samples or tokens per second): only their ratios matter.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hfai.protocol.types import SizeRate

#: The prior's weight against the squared log error of the measured points: the prior counts
#: the parameters' distance in log terms (log(1 + serial), log(1 + 10 sync)), weighted 0.01, so a
#: point off by 10% weighs about as much as doubling the serial fraction: two measured sizes
#: decide the curve.
PRIOR_WEIGHT = 0.01
#: How much more than its best measured size the curve may promise a size between two measured
#: ones (see _peaks_between).
PEAK_TOLERANCE = 0.05
#: A job whose GPUs were used less than this (%, the mean over its nodes) at a size gains nothing
#: from more nodes than that: its bottleneck is elsewhere (input, storage, communication). The
#: gain policy's default (``PolicyConfig.low_gpu_util``), and what ``hfai status`` says of a size.
LOW_GPU_UTIL = 40.0
#: Seconds of GPU utilisation measured at a size before it says anything of the job's scaling: a
#: few heartbeats' samples, each of an instant, are no evidence.
UTIL_MIN_S = 300.0
_SERIAL = (0.0, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
_SYNC = (0.0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.2, 0.5)


@dataclass(frozen=True)
class Speedup:
    """A fitted curve: ``relative(n)`` is the throughput on ``n`` nodes over that on one."""

    serial: float = 0.0
    sync: float = 0.0
    #: Nodes past which the job gains nothing (0: none): it kept its GPUs mostly idle at this
    #: size, so its bottleneck is not the GPUs (controller/throughput.py).
    cap: int = 0

    def relative(self, n: int) -> float:
        if n <= 0:
            return 0.0
        if self.cap:
            n = min(n, self.cap)
        return (1.0 + self.serial) / (1.0 / n + self.serial + self.sync * (n - 1))

    def gain(self, n: int, k: int = 1) -> float:
        """What ``k`` more nodes on top of ``n`` add, in one-node throughputs."""
        return self.relative(n + k) - self.relative(n)


LINEAR = Speedup(0.0, 0.0)


def _shape(s: float, c: float, n: int) -> float:
    return 1.0 / n + s + c * (n - 1)


@functools.lru_cache(maxsize=8192)
def fit(points: tuple[tuple[int, float], ...], prior_serial: float = 0.0) -> Speedup:
    """The curve through measured ``(nodes, rate)`` points (one per size; rates > 0), with the
    prior's serial fraction for what they leave open."""
    prior = Speedup(prior_serial, 0.0)
    pts = [(n, math.log(r)) for n, r in points if n >= 1 and r > 0]
    if not pts:
        return prior
    log_prior = math.log1p(prior_serial)
    lo, hi = min(n for n, _ in pts), max(n for n, _ in pts)
    best, best_err = prior, math.inf
    for s in _SERIAL:
        for c in _SYNC:
            if c and hi - lo > 1 and _peaks_between(s, c, lo, hi, {n for n, _ in pts}):
                continue
            # log rate = log K - log shape(n): K in closed form, the residuals' mean is zero.
            res = [lr + math.log(_shape(s, c, n)) for n, lr in pts]
            mean = sum(res) / len(res)
            err = sum((x - mean) ** 2 for x in res)
            err += PRIOR_WEIGHT * ((math.log1p(s) - log_prior) ** 2 + math.log1p(10 * c) ** 2)
            if err < best_err - 1e-12:
                best, best_err = Speedup(s, c), err
    return best


def _peaks_between(s: float, c: float, lo: int, hi: int, measured: set[int]) -> bool:
    """Whether the curve (serial ``s``, sync ``c``) promises a size strictly between the measured
    ``lo`` and ``hi`` more than :data:`PEAK_TOLERANCE` above every measured size: a peak where
    nothing was measured, which two points (a job as fast on 1 node as on 4) never show."""
    best = max(1.0 / _shape(s, c, n) for n in measured)
    return any(1.0 / _shape(s, c, n) > best * (1 + PEAK_TOLERANCE) for n in range(lo + 1, hi) if n not in measured)


def fit_points(points: Sequence[tuple[int, float]], prior_serial: float = 0.0) -> Speedup:
    """:func:`fit` of any sequence (sorted and made hashable for the cache)."""
    return fit(tuple(sorted(points)), prior_serial)


def persistent_utilization(rates: Iterable[SizeRate]) -> tuple[tuple[int, float], ...]:
    """``(nodes, GPU utilisation %)`` of the sizes whose utilisation was measured over at least
    :data:`UTIL_MIN_S` (``SizeRate.gpu_util``): what the policy sees (JobView.gpu_util)."""
    return tuple((r.nodes, r.gpu_util) for r in rates if r.gpu_util is not None and r.util_s >= UTIL_MIN_S)


def idle_cap(gpu_util: Iterable[tuple[int, float]], low: float = LOW_GPU_UTIL) -> int:
    """The smallest size at which the job kept its GPUs used less than ``low`` % (0: none): its
    curve's :attr:`Speedup.cap`, past which more nodes will not help it."""
    return min((n for n, util in gpu_util if util < low), default=0)
