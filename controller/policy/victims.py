"""The victim pool of one group round: the running jobs that may still be preempted, shrunk or
time-sliced for a waiting job, with per-priority, per-band and per-user totals, so that a waiting
job learns what it could free without scanning the running jobs (rules 4 and 5)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from hfai.controller.policy.rules import effective_priority, service_band
from hfai.controller.policy.views import JobView, PolicyConfig


@dataclass
class RunningLevel:
    """Running jobs of one effective priority that could be victims, cheapest first."""

    jobs: list[JobView]
    nodes: int = 0
    head: int = 0  # jobs[:head] are all taken (victims come off the front: a lazy deletion)
    # Of those, the jobs time slicing may take (held their nodes >= one slice), longest first,
    # with their node totals per user, so "how much could job X take" is O(1).
    sliceable: list[JobView] = field(default_factory=list)
    slice_ids: set[str] = field(default_factory=set)
    slice_nodes: int = 0
    slice_head: int = 0
    # The jobs that have not held their nodes for a slice yet (they will become sliceable),
    # earliest started first: only looked at to tell a waiting job when its turn comes.
    unripe: list[JobView] = field(default_factory=list)
    ready: bool = False  # lists sorted and slice_ids filled
    banded: bool = False  # the service bands of ``sliceable`` worked out (VictimPool.banded)
    # Nodes of the untaken sliceable jobs per service band, and per user and band (once banded):
    # "how much could a job of user U in band b take" is a sum over the few bands above b.
    band_nodes: list[int] = field(default_factory=list)
    user_band_nodes: dict[str, list[int]] = field(default_factory=dict)


class VictimPool:
    """Running jobs of one group that may still be chosen as victims, with quick totals. Built in
    one pass; a level's candidate lists are sorted only when a victim is looked for there."""

    def __init__(self, running: Iterable[JobView], now: float, config: PolicyConfig):
        self.prio: dict[str, int] = {}  # effective priority of every running job
        self.band: dict[str, int] = {}  # of the sliceable running jobs, per level when first needed
        self.levels: dict[int, RunningLevel] = {}
        cutoff = now - config.slice_s
        levels, prio = self.levels, self.prio
        decays = config.above_normal_s != math.inf
        for j in running:
            p = prio[j.id] = effective_priority(j, now, config) if decays else j.priority
            level = levels.get(p)
            if level is None:
                level = levels[p] = RunningLevel(jobs=[])
            level.jobs.append(j)
            n = len(j.held)
            level.nodes += n
            if j.dev:
                pass  # a development session is never time-sliced: only a higher priority takes it
            elif j.started_ts <= cutoff:
                level.sliceable.append(j)
                level.slice_nodes += n
            else:
                level.unripe.append(j)
        self.order = sorted(levels)
        self.now, self.config = now, config
        self.taken: set[str] = set()
        self.lower_cache: dict[int, int] = {}

    def banded(self, level: RunningLevel) -> dict[str, int]:
        """The service bands of the level's sliceable jobs, worked out when first asked for
        (most rounds look at one or two levels' victims, if any)."""
        band = self.band
        if not level.banded:
            now, config, taken = self.now, self.config, self.taken
            n_bands = len(config.service_bands) + 1
            level.band_nodes = totals = [0] * n_bands
            per_user = level.user_band_nodes
            for j in level.sliceable:
                b = band[j.id] = service_band(j, now, config)
                if j.id not in taken:
                    totals[b] += len(j.held)
                    user = per_user.get(j.user)
                    if user is None:
                        user = per_user[j.user] = [0] * n_bands
                    user[b] += len(j.held)
            level.banded = True
        return band

    def sorted_level(self, p: int) -> RunningLevel:
        level = self.levels[p]
        if not level.ready:
            # Most recently started first: preempting it loses the least work.
            level.jobs.sort(key=lambda j: (-j.started_ts, j.id))
            # Among equals: the most attained service yields first, then the longest held.
            band = self.banded(level)
            level.sliceable.sort(key=lambda j: (-band[j.id], j.started_ts, j.id))
            level.slice_ids = {j.id for j in level.sliceable}
            level.unripe.sort(key=lambda j: (j.started_ts, j.id))
            level.ready = True
        return level

    def take(self, job: JobView) -> None:
        """Mark ``job`` as a victim (whole or shrunk): it cannot be chosen again this round."""
        p = self.prio[job.id]
        level = self.sorted_level(p)  # its band totals are counted before the job is taken
        self.taken.add(job.id)
        self.lower_cache.clear()
        n = len(job.held)
        level.nodes -= n
        if job.id in level.slice_ids:
            level.slice_nodes -= n
            band = self.band[job.id]
            level.band_nodes[band] -= n
            level.user_band_nodes[job.user][band] -= n

    def lower_nodes(self, prio: int) -> int:
        found = self.lower_cache.get(prio)
        if found is None:
            found = self.lower_cache[prio] = sum(self.levels[p].nodes for p in self.order if p < prio)
        return found

    def untaken(self, level: RunningLevel, sliceable: bool) -> Iterator[JobView]:
        """The level's candidates not taken yet, cheapest first, skipping the taken front fast."""
        jobs = level.sliceable if sliceable else level.jobs
        i = level.slice_head if sliceable else level.head
        while i < len(jobs) and jobs[i].id in self.taken:
            i += 1
        if sliceable:
            level.slice_head = i
        else:
            level.head = i
        for v in jobs[i:] if i else jobs:
            if v.id not in self.taken:
                yield v

    def slice_nodes(self, prio: int, user: str, band: int) -> int:
        """Nodes a job of ``user`` in service band ``band`` could take by time slicing at ``prio``:
        of other users' jobs that held their nodes for a slice and are in a higher band."""
        level = self.levels.get(prio)
        if level is None or not level.slice_nodes:
            return 0
        self.banded(level)
        above = sum(level.band_nodes[band + 1:])
        own = level.user_band_nodes.get(user)
        return above - sum(own[band + 1:]) if own is not None else above

    def could_take_any(self, prio: int) -> bool:
        """Whether a job at ``prio`` could preempt anything at all (cheap early-out)."""
        return self.lower_nodes(prio) > 0 or (prio in self.levels and self.levels[prio].slice_nodes > 0)

    def most_nodes(self, prio: int) -> int:
        """At most how many nodes a job at ``prio`` could get by preemption (of any user)."""
        level = self.levels.get(prio)
        return self.lower_nodes(prio) + (level.slice_nodes if level is not None else 0)



@dataclass
class Victim:
    job: JobView
    gives: int  # nodes it frees for the waiting job
    sliced: bool
    shrink: bool

def drop_unneeded(chosen: list[Victim], need: int) -> list[Victim]:
    """Without the victims that are not needed after all (the last, bigger one covered them).
    The list is cheapest first, so walking back from the end drops the most expensive first."""
    total = sum(v.gives for v in chosen)
    kept = [chosen[-1]]
    for v in reversed(chosen[:-1]):
        if total - v.gives >= need:
            total -= v.gives
        else:
            kept.append(v)
    kept.reverse()
    return kept
