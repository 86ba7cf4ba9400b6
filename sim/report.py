"""What a replay measured, and how it is shown: the result record, quantiles, Jain's fairness
index, the policy table and the plot."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hfai.protocol.errors import HfaiError


@dataclass(frozen=True)
class Sample:
    t: float
    busy: int
    queued: int


@dataclass
class SimResult:
    policy: str
    nodes: int
    jobs: int
    makespan_s: float
    utilisation: float  # busy node-time / capacity, over the time some job waited
    overhead: float  # node-time spent checkpointing and restarting / busy node-time
    avg_jct_s: float
    median_jct_s: float
    p99_jct_s: float
    avg_queue_s: float  # submit to first start
    interrupts_per_job: float
    fairness: float  # Jain's index over users of (their run time / their JCT)
    decisions: int  # policy calls
    samples: list[Sample] = field(default_factory=list)
    p99_queue_s: float = 0.0  # 99th percentile of submit to first start (bench/bench_elastic.py)


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of an already sorted list."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one value has everything."""
    if not values:
        return 1.0
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq else 1.0


# ---------------------------------------------------------------------------------- reporting


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def format_table(results: Sequence[SimResult]) -> str:
    """One row per policy, fixed-width columns."""
    head = ("policy", "util", "ovh", "avg JCT", "med JCT", "p99 JCT", "avg queue", "intr/job", "fairness")
    rows = [head] + [
        (r.policy, f"{100 * r.utilisation:.1f}%", f"{100 * r.overhead:.1f}%", _dur(r.avg_jct_s), _dur(r.median_jct_s),
         _dur(r.p99_jct_s), _dur(r.avg_queue_s), f"{r.interrupts_per_job:.2f}", f"{r.fairness:.3f}")
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    return "\n".join(line(row) for row in rows)


def plot(results: Sequence[SimResult], out: str | Path) -> None:
    """Utilisation and queue length over time, one line per policy (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HfaiError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None
    fig, (ax_u, ax_q) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    for r in results:
        days = [s.t / 86400 for s in r.samples]
        # Samples are taken at events; the value holds until the next one, hence steps.
        ax_u.step(days, [100 * s.busy / r.nodes for s in r.samples], where="post", label=r.policy, linewidth=0.8)
        ax_q.step(days, [s.queued for s in r.samples], where="post", label=r.policy, linewidth=0.8)
    ax_u.set_ylabel("busy nodes (%)")
    ax_q.set_ylabel("jobs waiting")
    ax_q.set_xlabel("time (days)")
    ax_u.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
