"""Usage accounting (pure): the runs a job record shows, and GPU-hours per UTC day, user, group
and priority. The controllers copy each ended run to the bucket ``hfai_usage``
(:mod:`hfai.controller.usage_recorder`), so GPU-hours outlive the records purged after
``finished_retention_s``; a report merges those entries with the runs still going."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from hfai.api.present import DAY_S
from hfai.protocol.types import ChainState, JobRecord, UsageEntry, UsageRow, run_key

#: States in which a run's processes may still hold its nodes (the run has not ended).
_HOLDING = (ChainState.RUNNING, ChainState.SUSPENDING, ChainState.STOPPING)


def _nodes_of(job: JobRecord, run_id: int) -> int:
    """Nodes a run held. The record names the latest run's nodes; an earlier run of a fixed-size job
    held ``spec.nodes``; of an elastic one, the latest size is the best the record still knows."""
    latest = len(job.nodes or job.last_nodes)
    if run_id == job.run_id and latest:
        return latest
    if job.spec.elastic:
        return latest or job.spec.nodes
    return job.spec.nodes


def runs_of(job: JobRecord, now: float) -> list[tuple[UsageEntry, bool]]:
    """Every run the record's history shows, as (entry, ended). A run starts at a ``running`` event
    and ends at the next event that releases its nodes; a run still going ends ``now`` (and
    ``ended`` is False). Run ids count back from ``job.run_id`` (the latest start), so a history
    cut to its last events still numbers its runs right; a run whose start was cut is not shown."""
    starts = [i for i, e in enumerate(job.history) if e.state is ChainState.RUNNING]
    out: list[tuple[UsageEntry, bool]] = []
    for n, i in enumerate(starts):
        run_id = job.run_id - (len(starts) - 1 - n)
        if run_id < 1:
            continue
        end = next((e.ts for e in job.history[i + 1:] if e.state not in _HOLDING), None)
        entry = UsageEntry(job_id=job.id, run_id=run_id, user=job.spec.user, group=job.spec.group,
                           priority=job.spec.priority, nodes=_nodes_of(job, run_id), start_ts=job.history[i].ts,
                           end_ts=end if end is not None else max(now, job.history[i].ts))
        out.append((entry, end is not None))
    return out


def merge(stored: Iterable[UsageEntry], jobs: Iterable[JobRecord], now: float) -> list[UsageEntry]:
    """The stored (ended) runs plus the runs the live records show that are not stored yet: a stored
    entry wins, being written while the record still named that run's nodes."""
    by_key = {run_key(e.job_id, e.run_id): e for e in stored}
    for job in jobs:
        for entry, _ended in runs_of(job, now):
            by_key.setdefault(run_key(entry.job_id, entry.run_id), entry)
    return list(by_key.values())


def day_of(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%d")


def _day_pieces(start: float, end: float) -> Iterable[tuple[str, float]]:
    """(UTC day, seconds) of the interval [start, end), cut at midnights."""
    t = start
    while t < end:
        midnight = (t // DAY_S + 1) * DAY_S
        cut = min(end, midnight)
        yield day_of(t), cut - t
        t = cut


def usage_rows(entries: Iterable[UsageEntry], since_ts: float, until_ts: float) -> list[UsageRow]:
    """GPU-hours within [since_ts, until_ts) per (UTC day, user, group, priority); a run counts on
    every day it overlaps, by the part of it that fell on that day. Ordered by day, user, group,
    priority (highest first)."""
    hours: dict[tuple[str, str, str, int], float] = {}
    runs: dict[tuple[str, str, str, int], set[str]] = {}
    for e in entries:
        start, end = max(e.start_ts, since_ts), min(e.end_ts, until_ts)
        for day, seconds in _day_pieces(start, end):
            key = (day, e.user, e.group, e.priority)
            hours[key] = hours.get(key, 0.0) + seconds * e.nodes * e.gpus_per_node / 3600.0
            runs.setdefault(key, set()).add(run_key(e.job_id, e.run_id))
    return [UsageRow(day=k[0], user=k[1], group=k[2], priority=k[3], gpu_hours=hours[k], runs=len(runs[k]))
            for k in sorted(hours, key=lambda k: (k[0], k[1], k[2], -k[3]))]
