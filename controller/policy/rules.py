"""The ordering rules: effective priority (ABOVE_NORMAL's decay), attained-service bands, quota
usage and AUTO's resolution, and the queue order :func:`ordering` built from them (rule 1)."""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable

from hfai.controller.policy.views import JobView, PolicyConfig
from hfai.controller.queues import JobIndex, Ordering, priority_ordering
from hfai.protocol.quotas import Quotas
from hfai.protocol.types import Priority

ABOVE_NORMAL = Priority.ABOVE_NORMAL.value


def effective_priority(job: JobView, now: float, config: PolicyConfig) -> int:
    """The priority the job is scheduled at: ABOVE_NORMAL decays to NORMAL after running
    ``config.above_normal_s`` in total, so nobody holds the cluster at that level for ever."""
    if job.priority != ABOVE_NORMAL or config.above_normal_s == math.inf:
        return job.priority
    ran = job.run_s + (now - job.started_ts if job.state.holds_nodes else 0.0)
    return Priority.NORMAL.value if ran >= config.above_normal_s else job.priority


def service_band(job: JobView, now: float, config: PolicyConfig) -> int:
    """Which attained-service band the job is in: 0 until it has run ``service_bands[0]`` slices
    of node-time, and so on (rule 1)."""
    ran = job.run_s + (now - job.started_ts if job.state.holds_nodes else 0.0)
    return bisect.bisect_right(config.service_bands, ran * job.size / config.slice_s) if config.slice_s > 0 else 0


def quota_usage(jobs: Iterable[JobView]) -> dict[tuple[str, int, str], int]:
    """Nodes held now per (user, declared priority, group)."""
    used: dict[tuple[str, int, str], int] = defaultdict(int)
    for j in jobs:
        if j.state.holds_nodes:
            used[(j.user, j.priority, j.group)] += len(j.held)
    return used


def resolve_auto(user: str, group: str, nodes: int, jobs: Iterable[JobView], quotas: Quotas,
                 fallback: int = Priority.NORMAL.value) -> int:
    """AUTO at submit time: the highest level at which the user has a quota with room for
    ``nodes`` more nodes in ``group``. Levels without a quota do not count (else AUTO would always
    mean EXTREME_HIGH on a cluster without quotas); with no such level, ``fallback``."""
    used = quota_usage(jobs)
    for level in sorted(Priority, reverse=True):
        limit = quotas.limit(user, level.value, group)
        if limit is not None and used.get((user, level.value, group), 0) + nodes <= limit:
            return level.value
    return fallback


def ordering(config: PolicyConfig) -> Ordering:
    """How :func:`decide` lines up waiting jobs (rule 1): by effective priority, then service band
    (a waiting job's band cannot change while it waits), then original submit time."""

    def key(v: JobView) -> float:
        return service_band(v, 0.0, config) * BAND_WEIGHT + v.submit_ts

    return priority_ordering(config.above_normal_s, key, ("bands", config.slice_s, config.service_bands))


#: Far more than any submit time (seconds since 1970 stay below 1e11 until the year 5138).
BAND_WEIGHT = 1e11


def indexed(jobs: Iterable[JobView] | JobIndex, order: Ordering) -> JobIndex:
    """``jobs`` as an index in ``order``: itself if it already is one."""
    if isinstance(jobs, JobIndex):
        if jobs.signature == order.signature:
            return jobs
        jobs = jobs.views()
    return JobIndex.of(jobs, order)
