"""How long each job's current run has run, on this controller replica's monotonic clock.

A time limit (``--time``) and the run time a job carries into its next run (``JobRecord.run_s``)
must not be differences of wall stamps that different hosts wrote: a leader whose clock is 2 h
ahead of the one that started a run would read ``now - started_ts`` as 2 h and stop a job with a
1 h limit seconds after it started. So every replica, leader or standby, notes on its own
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

The same holds for the other windows of the policy: a time slice and
``above_normal_s`` count a run's time, so the planner rebases each running job's ``started_ts``
onto the leader's clock as ``now - ran`` (controller/plan.py); a ``--retry``'s backoff counts from
when the leader requeued the failed run (``retry_ts``, written by whichever leader did), so it is
measured here too, from this replica's first sight of that stamp (:meth:`RunClock.waited`). A
backoff seen first in the bucket's snapshot counts from its stamp on the server's clock once the
host's clock is measured, and from the first sight until then: it may wait longer, never shorter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

from hfai.controller.plan import PlanSettings
from hfai.core.clock import SYSTEM, Clock
from hfai.protocol.types import JobRecord


@dataclass(frozen=True)
class _Sight:
    key: object  # what the stamp belongs to: the run's id, or the retry's stamp
    mono: float  # this replica's monotonic clock when it first saw the run (or the retry)
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
        self._retries: dict[str, _Sight] = {}  # waiting jobs whose failed run is retried after a backoff

    def observe(self, job_id: str, job: JobRecord | None) -> None:
        """The record of ``job_id`` as the copy now holds it (None: gone)."""
        self._see(self._runs, job_id, job.run_id if job is not None and job.state.holds_nodes else None)
        self._see(self._retries, job_id, job.retry_ts if job is not None and job.state.waiting and job.retry_ts
                  else None)

    def _see(self, sights: dict[str, _Sight], job_id: str, key: object | None) -> None:
        if key is None:
            sights.pop(job_id, None)
            return
        sight = sights.get(job_id)
        if sight is None or sight.key != key:
            sights[job_id] = _Sight(key, self._clock.monotonic(), 0.0 if self._live() else None)

    def ran(self, job: JobRecord) -> float:
        """Seconds ``job``'s current run has run (0 if it holds no nodes). A run not observed yet
        (this leader's own start, ahead of the watch) is observed now."""
        if not job.state.holds_nodes:
            return 0.0
        self.observe(job.id, job)
        return self._since(self._runs, job.id, job.started_ts)

    def waited(self, job: JobRecord) -> float | None:
        """Seconds since ``job``'s failed run was set to be retried (its ``retry_ts``), or None if
        it waits for no retry. Observed now if not yet (as :meth:`ran`)."""
        if not (job.state.waiting and job.retry_ts):
            return None
        self.observe(job.id, job)
        return self._since(self._retries, job.id, job.retry_ts)

    def _since(self, sights: dict[str, _Sight], job_id: str, stamp: float) -> float:
        sight = sights[job_id]
        if sight.before is None:
            sight = sights[job_id] = self._dated(stamp, sight)
        return (sight.before or 0.0) + max(0.0, self._clock.monotonic() - sight.mono)

    def _dated(self, stamp: float, sight: _Sight) -> _Sight:
        """A run (or retry) older than the replica, with the time since its wall ``stamp`` when
        first seen, on the server's clock; as it was while this host's clock is not measured."""
        offset = self._offset()
        if offset is None:
            return sight
        server_at_sight = self._clock.time() - offset - (self._clock.monotonic() - sight.mono)
        before = max(0.0, server_at_sight - stamp) if stamp > 0 else 0.0
        return replace(sight, before=before)


def recount(before: JobRecord, after: JobRecord | None, clock: RunClock) -> JobRecord | None:
    """``after``, if it requeues ``before``'s run, with the time that run adds to ``run_s``
    measured by ``clock``: the pure transitions (transitions.requeue) add ``now - started_ts``, a
    difference of wall stamps that may come from two hosts."""
    if after is None or not before.state.holds_nodes or not after.state.waiting:
        return after
    return replace(after, run_s=before.run_s + clock.ran(before))


class RunAges(Mapping[str, float]):
    """job id -> :meth:`RunClock.ran` of its record in ``records``, for the jobs that hold nodes
    (with ``retries``: :meth:`RunClock.waited`, for the waiting jobs whose failed run is retried),
    worked out when asked: a round asks only about the jobs with a time limit, the jobs holding
    nodes and the gated ones."""

    def __init__(self, clock: RunClock, records: Mapping[str, JobRecord], retries: bool = False):
        self._clock, self._records, self._retries = clock, records, retries

    def _counts(self, job: JobRecord) -> bool:
        return bool(job.state.waiting and job.retry_ts) if self._retries else job.state.holds_nodes

    def __getitem__(self, job_id: str) -> float:
        job = self._records[job_id]
        if not self._counts(job):
            raise KeyError(job_id)
        return (self._clock.waited(job) or 0.0) if self._retries else self._clock.ran(job)

    def __iter__(self) -> Iterator[str]:
        return (k for k, j in list(self._records.items()) if self._counts(j))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def with_ages(settings: PlanSettings, clock: RunClock, records: Mapping[str, JobRecord]) -> PlanSettings:
    """``settings`` for a round in which runs are as old, and retries' backoffs as far along, as
    ``clock`` measures them."""
    return replace(settings, ran=RunAges(clock, records), retried=RunAges(clock, records, retries=True))
