"""The time-sharing timeline (pure): which job held which node when, and the moments that explain
it (preemptions, time slices, suspend acknowledgements, resumes), rebuilt from the job records'
histories alone.

A record's history says when each run started and on which nodes (the RUNNING event's typed
reason, :mod:`hfai.protocol.reasons`: STARTED or RESUMED with its nodes), why a run was
interrupted (the SUSPENDING event's: PREEMPTED, TIME_SLICE, or anything else: a plain
interruption) and how it ended (the SUSPENDED event's: ACKNOWLEDGED when every rank acknowledged
the suspend request, NOT_ACKNOWLEDGED when some did not). A run requeued without being asked to
suspend first (a node lost, a rank that failed and is retried, one the platform stopped, when
every rank had already exited) goes straight from RUNNING to SUSPENDED: that event's code
(NODE_LOST, EXITED, PLATFORM_STOPPED) marks the interruption. The words of a reason are never
read back: a reason this module does not know, or an event with only words, still shows, as a
plain interruption, never as nothing."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from hfai.protocol.reasons import Reason, ReasonCode, describe
from hfai.protocol.types import ChainState, JobEvent, JobRecord

#: One colour per job, in the order jobs first appear in the window (repeats after 20 jobs).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf", "#393b79", "#ad494a", "#637939", "#8c6d31", "#7b4173", "#3182bd", "#e6550d", "#31a354",
           "#756bb1", "#636363")


class MarkKind(enum.Enum):
    """What happened at a marked moment of a job on its nodes."""

    PREEMPTED = "preempted"            # a higher-priority job needed the nodes
    TIME_SLICE = "time slice"          # yielded to an equal-priority job with less service
    INTERRUPTED = "interrupted"        # requeued by someone, node lost, retry, resize, platform
    ACKNOWLEDGED = "suspend acknowledged"  # every rank acknowledged, the nodes were released
    NOT_ACKNOWLEDGED = "stopped unacknowledged"  # a rank ignored the request and was stopped
    RESUMED = "resumed"                # a later run of the same job started


@dataclass(frozen=True)
class Segment:
    """A run of ``job`` holding ``nodes`` over [start, end] (end is the window's end while it runs)."""

    job: str
    run: int
    nodes: tuple[str, ...]
    start: float
    end: float
    ongoing: bool


@dataclass(frozen=True)
class Mark:
    job: str
    ts: float
    kind: MarkKind
    nodes: tuple[str, ...]
    reason: str


_MARKS: dict[ChainState, dict[str, MarkKind]] = {
    ChainState.SUSPENDING: {ReasonCode.PREEMPTED: MarkKind.PREEMPTED, ReasonCode.TIME_SLICE: MarkKind.TIME_SLICE},
    ChainState.SUSPENDED: {ReasonCode.ACKNOWLEDGED: MarkKind.ACKNOWLEDGED,
                           ReasonCode.NOT_ACKNOWLEDGED: MarkKind.NOT_ACKNOWLEDGED,
                           ReasonCode.NODE_LOST: MarkKind.INTERRUPTED, ReasonCode.EXITED: MarkKind.INTERRUPTED,
                           ReasonCode.PLATFORM_STOPPED: MarkKind.INTERRUPTED},
}


def mark_kind(state: ChainState, why: Reason | None) -> MarkKind | None:
    """The mark an event makes on the timeline, or None (a start, a stop, an end: the bar shows
    those). ``why``: the event's typed reason."""
    if state not in _MARKS:
        return None
    found = _MARKS[state].get(why.code) if why is not None else None
    if found is None and state is ChainState.SUSPENDING:
        return MarkKind.INTERRUPTED
    return found  # SUSPENDED: the end of an interruption marked when it began, or a requeue at once


def _start_nodes(e: JobEvent) -> tuple[str, ...] | None:
    """The nodes a RUNNING event names (rank order), or None."""
    if e.why is None or e.why.code not in (ReasonCode.STARTED, ReasonCode.RESUMED):
        return None
    listed = e.why.params.get("nodes")
    if listed is None:
        return None
    return tuple(n.strip() for n in listed.split(",") if n.strip())


def job_timeline(job: JobRecord, now: float) -> tuple[list[Segment], list[Mark]]:
    """The runs and marks of one job over its whole kept history (at most 50 events)."""
    segments: list[Segment] = []
    marks: list[Mark] = []
    run = job.run_id - sum(e.state is ChainState.RUNNING for e in job.history)  # runs before the kept history
    nodes: tuple[str, ...] = ()
    start: float | None = None
    history = job.history
    if history and history[0].state.holds_nodes and history[0].state is not ChainState.RUNNING:
        # The history was cut inside a run: it began at started_ts on the nodes of the latest run
        # if no later start is kept, else on nodes this record no longer names.
        later_start = any(e.state is ChainState.RUNNING for e in history)
        nodes = () if later_start else (job.nodes or job.last_nodes)
        start = min(job.started_ts or history[0].ts, history[0].ts)
    previous: ChainState | None = None
    for e in history:
        after, previous = previous, e.state
        if e.state is ChainState.RUNNING:
            run += 1
            is_latest = run == job.run_id
            nodes = _start_nodes(e) or ((job.nodes or job.last_nodes) if is_latest else ())
            start = e.ts
            if run > 1:
                marks.append(Mark(job.id, e.ts, MarkKind.RESUMED, nodes, describe(e)))
            continue
        kind = mark_kind(e.state, e.why)
        if kind is MarkKind.INTERRUPTED and after is ChainState.SUSPENDING:
            kind = None  # a node lost while suspending: the interruption was marked when it began
        if kind is not None:
            marks.append(Mark(job.id, e.ts, kind, nodes, describe(e)))
        if not e.state.holds_nodes and start is not None:
            if nodes:
                segments.append(Segment(job.id, run, nodes, start, e.ts, ongoing=False))
            start = None
    if start is not None and job.state.holds_nodes and nodes:
        segments.append(Segment(job.id, run, nodes, start, now, ongoing=True))
    return segments, marks


@dataclass(frozen=True)
class Timeline:
    """Everything a Gantt chart of nodes × time needs, JSON-ready through :meth:`as_json`."""

    t0: float
    t1: float
    nodes: tuple[str, ...]
    jobs: tuple[dict, ...]
    segments: tuple[Segment, ...]
    marks: tuple[Mark, ...]

    def as_json(self) -> dict:
        return {"t0": self.t0, "t1": self.t1, "nodes": list(self.nodes), "jobs": list(self.jobs),
                "segments": [asdict(s) for s in self.segments],
                "marks": [{**asdict(m), "kind": m.kind.value} for m in self.marks],
                "kinds": [k.value for k in MarkKind]}


def timeline(jobs: Iterable[JobRecord], t0: float, t1: float, nodes: Sequence[str] = (),
             only: Sequence[str] | None = None) -> Timeline:
    """The segments and marks of ``jobs`` that fall in [t0, t1], clipped to it. ``nodes`` (every
    node of the cluster, in display order) are the rows; nodes only the histories name are added
    after them (a node since removed). ``only``: keep just these nodes (a job's page shows its
    nodes, with whichever jobs held them before, after or instead of it)."""
    keep = None if only is None else set(only)
    segments: list[Segment] = []
    marks: list[Mark] = []
    by_id = {}
    for job in jobs:
        segs, ms = job_timeline(job, t1)
        if keep is not None:
            segs = [Segment(s.job, s.run, tuple(n for n in s.nodes if n in keep), s.start, s.end, s.ongoing)
                    for s in segs]
            ms = [Mark(m.job, m.ts, m.kind, tuple(n for n in m.nodes if n in keep), m.reason) for m in ms]
        segs = [Segment(s.job, s.run, s.nodes, max(s.start, t0), min(s.end, t1), s.ongoing) for s in segs
                if s.end >= t0 and s.start <= t1 and s.nodes]
        ms = [m for m in ms if t0 <= m.ts <= t1 and m.nodes]
        if segs or ms:
            by_id[job.id] = job
            segments += segs
            marks += ms
    first: dict[str, float] = {}
    for s in sorted(segments, key=lambda s: s.start):
        first.setdefault(s.job, s.start)
    for m in marks:
        first.setdefault(m.job, m.ts)
    order = sorted(by_id, key=lambda j: (first.get(j, t1), j))
    rows = list(nodes)
    known = set(rows)
    for s in segments:
        for n in s.nodes:
            if n not in known:
                known.add(n)
                rows.append(n)
    job_rows = tuple({"id": j, "name": by_id[j].spec.name, "user": by_id[j].spec.user,
                      "colour": PALETTE[i % len(PALETTE)]} for i, j in enumerate(order))
    return Timeline(t0, t1, tuple(rows), job_rows, tuple(segments), tuple(marks))
