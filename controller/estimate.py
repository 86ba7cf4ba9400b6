"""When will a waiting job start? A forward replay of the leader's own plan in virtual time (pure).

Starting from the records as they are now, every running job is assumed to run until its time
limit (``-t``, over all its runs) and every job started in the replay to run its limit too; jobs
in their interrupt window release their nodes after ``release_s``; nothing new arrives. The plan
(controller/plan.py, so the live policy with its priorities, slices and gates) is run at each
such event, as the simulator does, and the first time each waiting job starts is its estimate.
A job that runs without a time limit is assumed to run ``default_run_s`` (None: for ever), so the
jobs that wait behind it get no estimate: like Slurm's, an estimate is only as good as the limits
people give.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import replace

from hfai.controller import transitions
from hfai.controller.plan import Interrupt, Planner, PlanNode, PlanSettings, StartRun
from hfai.protocol.types import ChainState, JobRecord


def estimate_starts(records: Iterable[JobRecord], nodes: Sequence[PlanNode], settings: PlanSettings, now: float,
                    horizon_s: float = 30 * 86400.0, default_run_s: float | None = None, release_s: float = 60.0,
                    max_rounds: int = 2000) -> dict[str, float]:
    """job id -> estimated start time (same clock as ``now``) of each job waiting now that would
    start within ``horizon_s``; jobs without an estimate are left out."""
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
            ends[r.id] = now + _left(r, now, default_run_s)
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
                ends[a.job_id] = t + _left(after, t, default_run_s)
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


def _left(job: JobRecord, now: float, default_run_s: float | None) -> float:
    """Seconds the job's current run still has, by its time limit (or the default)."""
    limit = job.spec.time_limit_s
    if limit <= 0:
        return math.inf if default_run_s is None else default_run_s
    return max(0.0, limit - job.run_s - max(0.0, now - job.started_ts))

