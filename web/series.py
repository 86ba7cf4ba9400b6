"""Chart series and their inline SVG (pure): per-GPU figures over the last hour, and cluster
figures over time rebuilt from job records' histories."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from hfai.protocol.types import ChainState, JobRecord, NodeRecord


@dataclass(frozen=True)
class Sample:
    """One heartbeat's GPU figures: utilisation (0-100) and memory used (fraction) per GPU."""

    ts: float
    util: tuple[float, ...]
    mem: tuple[float, ...]


def sample_of(record: NodeRecord) -> Sample:
    return Sample(ts=record.ts, util=tuple(float(g.utilization) for g in record.gpus),
                  mem=tuple(g.memory_used / g.memory_total if g.memory_total else 0.0 for g in record.gpus))


def per_gpu(samples: Sequence[Sample], field: str, since: float) -> list[list[tuple[float, float]]]:
    """One series of (ts, value) per GPU index from the samples at or after ``since``; utilisation in
    0-1 like memory."""
    scale = 0.01 if field == "util" else 1.0
    series: list[list[tuple[float, float]]] = []
    for s in samples:
        if s.ts < since:
            continue
        for i, v in enumerate(getattr(s, field)):
            while len(series) <= i:
                series.append([])
            series[i].append((s.ts, max(0.0, min(1.0, v * scale))))
    return series


def downsample(points: Sequence[tuple[float, float]], most: int) -> list[tuple[float, float]]:
    """At most ``most`` points: the mean of equal runs of consecutive points."""
    if len(points) <= most:
        return list(points)
    out = []
    step = len(points) / most
    for k in range(most):
        chunk = points[int(k * step):int((k + 1) * step)] or points[int(k * step):int(k * step) + 1]
        out.append((sum(p[0] for p in chunk) / len(chunk), sum(p[1] for p in chunk) / len(chunk)))
    return out


def svg_chart(series: Iterable[Sequence[tuple[float, float]]], t0: float, t1: float, title: str,
              width: int = 240, height: int = 48, ymax: float = 1.0, stale: bool = False) -> str:
    """Lines of (ts, value) over [t0, t1], value 0..ymax, as a small inline SVG."""
    lines = []
    span = max(t1 - t0, 1e-9)
    for i, pts in enumerate(series):
        if not pts:
            continue
        coords = " ".join(f"{(t - t0) / span * width:.1f},{height - min(v, ymax) / ymax * height:.1f}"
                          for t, v in downsample(pts, width // 2))
        hue = (i * 45) % 360
        colour = "#999" if stale else f"hsl({hue},70%,40%)"
        lines.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1" points="{coords}"/>')
    return (f'<svg class="chart{" stale" if stale else ""}" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">'
            f'<title>{html.escape(title)}</title><rect width="{width}" height="{height}" fill="#f6f6f6"/>'
            + "".join(lines) + "</svg>")


def _waiting_at(job: JobRecord, t: float) -> bool:
    state = None
    for e in job.history:
        if e.ts > t:
            break
        state = e.state
    return state is not None and state.waiting


def _nodes_at(job: JobRecord, t: float) -> int:
    state = None
    for e in job.history:
        if e.ts > t:
            break
        state = e.state
    return len(job.nodes or job.last_nodes) or job.spec.nodes if state in (
        ChainState.RUNNING, ChainState.SUSPENDING, ChainState.STOPPING) else 0


def cluster_series(jobs: Sequence[JobRecord], t0: float, t1: float, points: int = 60
                   ) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """(queue length, nodes in use) at ``points`` instants over [t0, t1], from the records' histories."""
    step = (t1 - t0) / max(1, points - 1)
    queue, used = [], []
    for k in range(points):
        t = t0 + k * step
        queue.append((t, float(sum(_waiting_at(j, t) for j in jobs))))
        used.append((t, float(sum(_nodes_at(j, t) for j in jobs))))
    return queue, used
