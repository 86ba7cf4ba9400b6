"""Chart series (pure, JSON-ready; the pages draw them with plotly.js): per-GPU figures over the
last hour, a nodes × time heat map, a job's GPUs over its runs, and cluster figures over time
rebuilt from job records' histories."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


def gpu_lines(samples: Sequence[Sample], since: float, most: int = 240) -> dict:
    """A node's chart: per GPU, utilisation (%) and memory used (%) at each sample since ``since``
    (at most ``most`` points a line, means of neighbours beyond that)."""
    out: dict = {"util": [], "mem": []}
    for field, key in (("util", "util"), ("mem", "mem")):
        for line in per_gpu(samples, field, since):
            pts = downsample(line, most)
            out[key].append({"ts": [round(t, 3) for t, _ in pts], "v": [round(v * 100.0, 1) for _, v in pts]})
    return out


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def heat_map(samples_of: Mapping[str, Sequence[Sample]], nodes: Sequence[str], t0: float, t1: float,
             bucket_s: float = 60.0) -> dict:
    """Nodes × time: the mean over each node's GPUs of utilisation and memory used (%) per
    ``bucket_s``, None where the node sent no heartbeat. One row per node keeps 128 nodes readable
    where 128 small line charts are not."""
    count = max(1, int((t1 - t0) // bucket_s) + 1)
    xs = [t0 + (k + 0.5) * bucket_s for k in range(count)]
    util_rows, mem_rows = [], []
    for node in nodes:
        sums: dict[int, list[tuple[float, float]]] = {}
        for s in samples_of.get(node, ()):
            if t0 <= s.ts <= t1 and s.util:
                sums.setdefault(int((s.ts - t0) // bucket_s), []).append((_mean(s.util), _mean(s.mem) * 100.0))
        util_rows.append([round(_mean([u for u, _ in sums[k]]), 1) if k in sums else None for k in range(count)])
        mem_rows.append([round(_mean([m for _, m in sums[k]]), 1) if k in sums else None for k in range(count)])
    return {"x": xs, "nodes": list(nodes), "util": util_rows, "mem": mem_rows}


def job_gpu(samples_of: Mapping[str, Sequence[Sample]], segments: Sequence[tuple[Sequence[str], float, float]],
            most: int = 240, most_lines: int = 8) -> dict:
    """A job's GPUs over its runs: per node it ran on, the mean over the node's GPUs of
    utilisation and memory used (%) while the job held it (at most ``most`` points a node);
    runs are separated by a gap (None), so no line joins two runs. Over ``most_lines`` nodes:
    three lines instead, the nodes' mean, lowest and highest (at most ``most`` steps)."""
    per_run = max(2, most // max(1, len(segments)))
    lines: dict[str, dict[str, Any]] = {}
    for nodes, start, end in sorted(segments, key=lambda s: s[1]):
        for node in nodes:
            pts = [(s.ts, _mean(s.util), _mean(s.mem) * 100.0) for s in samples_of.get(node, ())
                   if start <= s.ts <= end and s.util]
            if not pts:
                continue
            if len(pts) > per_run:
                step = len(pts) / per_run
                pts = [pts[int(k * step)] for k in range(per_run)]
            line = lines.setdefault(node, {"node": node, "ts": [], "util": [], "mem": []})
            if line["ts"]:
                line["ts"].append(round(start, 3))
                line["util"].append(None)
                line["mem"].append(None)
            line["ts"] += [round(t, 3) for t, _, _ in pts]
            line["util"] += [round(u, 1) for _, u, _ in pts]
            line["mem"] += [round(m, 1) for _, _, m in pts]
    if len(lines) > most_lines:
        return {"nodes": _spread(list(lines.values()), sorted(start for _, start, _ in segments), most)}
    return {"nodes": list(lines.values())}


def _spread(lines: list[dict[str, Any]], starts: list[float], most: int) -> list[dict[str, Any]]:
    """Many nodes' lines as three: their mean, lowest and highest per time step (steps without a
    figure are left out; a gap stays between runs, ``starts`` being when each run began), so a
    64-node job's chart is read at a glance."""
    ts = [t for src in lines for t, u in zip(src["ts"], src["util"], strict=True) if u is not None]
    t0, t1 = min(ts), max(ts)
    step = max((t1 - t0) / most, 1e-9)
    buckets: dict[int, list[tuple[float, float, float]]] = {}
    for src in lines:
        for t, u, m in zip(src["ts"], src["util"], src["mem"], strict=True):
            if u is not None:
                buckets.setdefault(min(most - 1, int((t - t0) / step)), []).append((t, u, m))
    out = []
    for name, pick in ((f"mean of {len(lines)} nodes", lambda vs: sum(vs) / len(vs)), ("lowest node", min),
                       ("highest node", max)):
        line: dict[str, Any] = {"node": name, "ts": [], "util": [], "mem": []}
        run = None
        for k in sorted(buckets):
            pts = buckets[k]
            this = bisect.bisect_right(starts, pts[0][0])
            if run is not None and this != run:  # a new run: no line across the time between
                line["ts"].append(round(pts[0][0], 3))
                line["util"].append(None)
                line["mem"].append(None)
            run = this
            line["ts"].append(round(sum(p[0] for p in pts) / len(pts), 3))
            line["util"].append(round(pick([p[1] for p in pts]), 1))
            line["mem"].append(round(pick([p[2] for p in pts]), 1))
        out.append(line)
    return out


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
