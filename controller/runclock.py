"""How long each job's current run has run, on this controller replica's monotonic clock.

A time limit (``--time``) and the run time a job carries into its next run (``JobRecord.run_s``)
must not be differences of wall stamps that different hosts wrote: a leader whose clock is 2 h
ahead of the one that started a run read ``now - started_ts`` as 2 h and stopped a job with a 1 h
limit 5 s after it started (issue 38 §4). So every replica, leader or standby, notes on its own
monotonic clock when it first saw each run in its copy of the jobs bucket (the watch delivers a
start within milliseconds, to every replica), and a leader measures a run from there: a takeover
inherits nothing but the records, and still counts right.

Only a run that began before this replica saw the bucket (the replica started, or restarted,
while it ran) has no such sight; it is counted from its wall stamp once, on the NATS server's
clock as the replica measured its own against it (controller/clockcheck.py), and on the monotonic
clock from then on. Until that measurement it counts from the replica's first sight: too short,
never too long, so a replica whose clock is off stops no job early while it does not know. A
replica whose watch of the bucket broke and resumed sees runs that started meanwhile late, and
counts them short by that gap.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from hfai._clock import SYSTEM, Clock
from hfai.controller.plan import PlanSettings
from hfai.protocol.types import JobRecord


@dataclass(frozen=True)
class _Sight:
    run_id: int
    mono: float  # this replica's monotonic clock when it first saw the run
    # Seconds the run had run by then: 0 if it saw the run begin; None for a run older than the
    # replica until this host's clock is measured against the server's.
    before: float | None


class RunClock:
    """``observe`` each record as the replica's copy changes; ``ran`` a running job's run.

    ``live`` tells whether what is observed now is news (a record written just now) or the
    bucket's first snapshot (records written before this replica watched); ``offset`` is how far
    this host's wall clock is ahead of the NATS server's (None while unknown)."""

    def __init__(self, clock: Clock = SYSTEM, live: Callable[[], bool] = lambda: True,
                 offset: Callable[[], float | None] = lambda: 0.0):
        self._clock = clock
        self._live = live
        self._offset = offset
        self._runs: dict[str, _Sight] = {}

    def observe(self, job_id: str, job: JobRecord | None) -> None:
        """The record of ``job_id`` as the copy now holds it (None: gone)."""
        if job is None or not job.state.holds_nodes:
            self._runs.pop(job_id, None)
            return
        sight = self._runs.get(job_id)
        if sight is None or sight.run_id != job.run_id:
            self._runs[job_id] = _Sight(job.run_id, self._clock.monotonic(), 0.0 if self._live() else None)

    def ran(self, job: JobRecord) -> float:
        """Seconds ``job``'s current run has run (0 if it holds no nodes). A run not observed yet
        (this leader's own start, ahead of the watch) is observed now."""
        if not job.state.holds_nodes:
            return 0.0
        self.observe(job.id, job)
        sight = self._runs[job.id]
        if sight.before is None:
            sight = self._runs[job.id] = self._dated(job, sight)
        return (sight.before or 0.0) + max(0.0, self._clock.monotonic() - sight.mono)

    def _dated(self, job: JobRecord, sight: _Sight) -> _Sight:
        """A run older than the replica, with the time it had run when first seen, from its wall
        stamp on the server's clock; as it was while this host's clock is not measured."""
        offset = self._offset()
        if offset is None:
            return sight
        server_at_sight = self._clock.time() - offset - (self._clock.monotonic() - sight.mono)
        before = max(0.0, server_at_sight - job.started_ts) if job.started_ts > 0 else 0.0
        return replace(sight, before=before)


def recount(before: JobRecord, after: JobRecord | None, clock: RunClock) -> JobRecord | None:
    """``after``, if it requeues ``before``'s run, with the time that run adds to ``run_s``
    measured by ``clock``: the pure transitions (transitions.requeue) add ``now - started_ts``, a
    difference of wall stamps that may come from two hosts."""
    if after is None or not before.state.holds_nodes or not after.state.waiting:
        return after
    return replace(after, run_s=before.run_s + clock.ran(before))


class RunAges(Mapping[str, float]):
    """job id -> :meth:`RunClock.ran` of its record in ``records``, for the jobs that hold nodes,
    worked out when asked: a round asks only about the jobs with a time limit."""

    def __init__(self, clock: RunClock, records: Mapping[str, JobRecord]):
        self._clock, self._records = clock, records

    def __getitem__(self, job_id: str) -> float:
        job = self._records[job_id]
        if not job.state.holds_nodes:
            raise KeyError(job_id)
        return self._clock.ran(job)

    def __iter__(self) -> Iterator[str]:
        return (k for k, j in list(self._records.items()) if j.state.holds_nodes)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def with_ages(settings: PlanSettings, clock: RunClock, records: Mapping[str, JobRecord]) -> PlanSettings:
    """``settings`` for a round in which runs are as old as ``clock`` measures them."""
    return replace(settings, ran=RunAges(clock, records))
