"""When will a waiting job start? A forward replay of the leader's own plan in virtual time (pure).

Starting from the records as they are now, every running job is assumed to run until its time
limit (``-t``, over all its runs) and every job started in the replay to run its limit too; jobs
in their interrupt window release their nodes after ``release_s``; nothing new arrives. The plan
(controller/plan.py, so the live policy with its priorities, slices and gates) is run at each
such event, as the simulator does, and the first time each waiting job starts is its estimate.
A job that runs without a time limit is assumed to run ``default_run_s`` (None: for ever), so the
jobs that wait behind it get no estimate: like Slurm's, an estimate is only as good as the limits
people give. Or, with a :class:`Guess` (what ``hfai estimate`` does unless told ``--assume``), a job
without a limit is guessed from the cluster's history: one started in the replay runs as long as the
median of the jobs that finished here, and a running one for what that median leaves it, or, once
it has run longer than that, as long again as it already has (a job that has run for t is as
likely as not to run t more).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from hfai.controller import transitions
from hfai.controller.plan import Interrupt, Planner, PlanNode, PlanSettings, StartRun
from hfai.protocol.types import ChainState, JobRecord


@dataclass(frozen=True)
class Guess:
    """How long a job without a time limit is guessed to run (see the module's docstring)."""

    typical_run_s: float  # a whole job's running time: the median of those that finished
    min_left_s: float = 60.0  # what a running job is given at least

    def left(self, ran_s: float) -> float:
        """Seconds still to run, for a job that has run ``ran_s`` so far."""
        return max(self.min_left_s, self.typical_run_s - ran_s if ran_s < self.typical_run_s else ran_s)


def guess_from_history(records: Iterable[JobRecord], fallback_s: float = 3600.0) -> Guess:
    """The guess from the jobs that succeeded (their whole running time); ``fallback_s`` when none did."""
    done = [t for t in (whole_run_s(r) for r in records if r.state is ChainState.SUCCEEDED) if t > 0]
    return Guess(statistics.median(done) if done else fallback_s)


def whole_run_s(record: JobRecord) -> float:
    """How long a finished job ran over all its runs: ``run_s`` counts the runs before its last
    (a job that finished in one run has none), the last one ran from ``started_ts`` to ``ended_ts``."""
    last = record.ended_ts - record.started_ts if 0 < record.started_ts <= record.ended_ts else 0.0
    return record.run_s + last


def estimate_starts(records: Iterable[JobRecord], nodes: Sequence[PlanNode], settings: PlanSettings, now: float,
                    horizon_s: float = 30 * 86400.0, default_run_s: float | None = None, release_s: float = 60.0,
                    max_rounds: int = 2000, guess: Guess | None = None) -> dict[str, float]:
    """job id -> estimated start time (same clock as ``now``) of each job waiting now that would
    start within ``horizon_s``; jobs without an estimate are left out. A job without a time limit
    runs ``default_run_s`` if given, else as ``guess`` says, else for ever."""
    planner = Planner()
    quiet = replace(settings, policy=replace(settings.policy, explain_waits=False))
    ends: dict[str, float] = {}  # job id -> when its current run ends (virtual time)
    waiting_now: set[str] = set()
    for r in records:
        if r.state.final:
            continue
        planner.observe(r)
        if r.state.waiting:
            waiting_now.add(r.id)
        elif r.state is ChainState.RUNNING:
            ends[r.id] = now + _left(r, now, default_run_s, guess)
        else:  # suspending or stopping: released after the interrupt window
            ends[r.id] = now + release_s
    starts: dict[str, float] = {}
    t = now
    for _ in range(max_rounds):
        for a in planner.plan(nodes, quiet, t):
            job = planner.records.get(a.job_id)
            if job is None:
                continue
            after = a.apply(job, t)
            if after is None:
                continue
            planner.observe(after)
            if isinstance(a, StartRun):
                if a.job_id in waiting_now:
                    starts.setdefault(a.job_id, t)
                ends[a.job_id] = t + _left(after, t, default_run_s, guess)
            elif isinstance(a, Interrupt) or after.state is ChainState.STOPPING:
                ends[a.job_id] = t + release_s
            if after.state.final:
                ends.pop(a.job_id, None)
        if waiting_now <= starts.keys():
            break
        due = min((e for e in ends.values() if math.isfinite(e)), default=math.inf)
        if due > now + horizon_s:
            break
        t = due
        for job_id in [j for j, e in ends.items() if e <= t]:
            del ends[job_id]
            planner.observe(transitions.ranks_exited(planner.records[job_id], t))
    return starts


def _left(job: JobRecord, now: float, default_run_s: float | None, guess: Guess | None) -> float:
    """Seconds the job's current run still has, by its time limit (or the default, or the guess)."""
    limit = job.spec.time_limit_s
    if limit <= 0:
        if default_run_s is not None:
            return default_run_s
        return math.inf if guess is None else guess.left(job.run_s + max(0.0, now - job.started_ts))
    return max(0.0, limit - job.run_s - max(0.0, now - job.started_ts))

