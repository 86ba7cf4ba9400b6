"""The scheduling policy: one pure function from (jobs, nodes, now, config) to decisions.

It never touches NATS, clocks or files; the leader's executor applies what it returns, and the
trace simulator (:mod:`hfai.controller.sim`) runs the very same function in virtual time.
docs/scheduling.md states the rules for users; in short, per node group:

1. Order: higher *effective* priority first (ABOVE_NORMAL counts as NORMAL once the job has run
   ``above_normal_s`` in total); within a priority, first-come-first-served by original submit
   time (a resumed job keeps its place), except that each time-slice turn a job had moves it
   ``turn_s`` later (round-robin with a bounded wait).
2. Quotas: a job starts only if its user's nodes at its (declared) priority in its group stay
   within the quota; otherwise it waits, saying so, and reserves nothing.
3. Gang: a job gets all its nodes at once (elastic jobs: at least ``min_nodes``) or waits;
   victims are whole jobs, never part of a gang (an elastic job may be shrunk, which is a whole
   restart at a smaller size).
4. A job that does not fit counts free nodes and nodes already being released (jobs in their
   interrupt window count as leaving and are never asked twice), then picks the victims that cost
   least: lowest priority first, most recently started first; never a job of the same user and
   priority. Preemption happens only if it frees enough nodes, so nobody is interrupted for
   nothing, and victims that turn out not to be needed are dropped again.
5. Time slicing: a running job of the same effective priority but another user that has held its
   nodes for at least ``slice_s`` may be suspended (it moves back in the round-robin). A job that
   just (re)started is never sliced, so it keeps its nodes for at least one slice.
6. Reservation and backfill: a blocked job that is waiting for nodes it has already claimed
   (being released) pins the free nodes; one that cannot claim enough yet lets jobs behind it use
   the free nodes if it could later preempt them (lower priority, or same priority and another
   user, i.e. at most one slice away), and its own user's equal-priority jobs only until it has
   waited ``own_backfill_s``, so backfill never starves the head of the line.
7. Elastic jobs (``min_nodes..max_nodes``) start with what is left after every waiting job was
   served, grow into idle nodes when nothing waits (a ``Resize``: restart at a larger size), and
   are shrunk (a ``Resize`` to a smaller size) before whole jobs are taken as victims.
8. Nodes that are not schedulable (drained, down, GPU errors) get no work.

Cost: O((W + R) log(W + R)) for W waiting and R running jobs, with per-priority totals so that a
waiting job never scans the running jobs just to learn it cannot preempt any.
"""

from __future__ import annotations

import bisect
import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from hfai.controller.queues import GroupJobs, JobIndex, Key, Level, Ordering, priority_ordering
from hfai.protocol.types import ChainState, Priority

#: Wildcard for the user or group part of a quota key.
ANY = "*"

#: How the wait reason of a job that only time slicing can serve begins (the leader keeps its
#: countdown current: see transitions.wait_gist).
TIME_SLICE_WAIT = "waiting for its time slice"


@dataclass(frozen=True)
class Quotas:
    """Node quotas per (user, priority, group): the most nodes a user's jobs of that priority may
    hold in that group at once. ``limits`` maps ``(user, priority, group)`` to a node count; the
    user or the group may be :data:`ANY`. The most specific key wins: (user, p, group), (user, p,
    ANY), (ANY, p, group), (ANY, p, ANY). No matching key means no limit, except at levels above
    ``closed_above``: there it means 0 nodes (the level is closed until an operator gives a quota,
    ``*`` opening it for everyone), unless the job is ``exempt`` (an operator's). A live cluster
    closes the levels above NORMAL (:func:`hfai.controller.views.quotas_of`); None closes none.
    """

    limits: Mapping[tuple[str, int, str], int] = field(default_factory=dict)
    closed_above: int | None = None

    def limit(self, user: str, priority: int, group: str, exempt: bool = False) -> int | None:
        found = self.explicit(user, priority, group) if self.limits else None
        if found is None and not exempt and self.closed(priority):
            return 0
        return found

    def explicit(self, user: str, priority: int, group: str) -> int | None:
        """The quota a key sets for the user (None: no key matches)."""
        get = self.limits.get
        for key in ((user, priority, group), (user, priority, ANY), (ANY, priority, group), (ANY, priority, ANY)):
            found = get(key)
            if found is not None:
                return found
        return None

    def closed(self, priority: int) -> bool:
        """Whether ``priority`` is a level that needs a quota (no key: 0 nodes)."""
        return self.closed_above is not None and priority > self.closed_above

    def closed_by_default(self, user: str, priority: int, group: str, exempt: bool = False) -> bool:
        """Whether the user gets no nodes at ``priority`` only because no quota opens the level."""
        return not exempt and self.closed(priority) and self.explicit(user, priority, group) is None


@dataclass(frozen=True)
class PolicyConfig:
    #: A running job holds its nodes at least this long before an equal-priority job may take
    #: them (time slice), and an elastic job runs this long before it is grown.
    slice_s: float = 1800.0
    #: ABOVE_NORMAL counts as NORMAL once the job has run this long in total (anti-hogging).
    above_normal_s: float = math.inf
    quotas: Quotas = field(default_factory=Quotas)
    #: Grow an elastic job only if it gains at least this fraction of its size (and one node):
    #: growing costs a restart, so a tiny gain is not worth it.
    grow_min_gain: float = 0.25
    #: Attained-service bands, in slices of node-time (``slice_s`` node-seconds; with the default
    #: slice: 1, 8 and 64 node-hours). Within a priority, jobs in a lower band (less service so far)
    #: go first and may take a time slice from jobs in a higher one; FIFO within a band.
    service_bands: tuple[float, ...] = (2.0, 16.0, 128.0)
    #: A blocked job lets later jobs of its own user and priority run on the free nodes (it could
    #: not take them back) until it has waited this long; then it keeps them free for itself.
    own_backfill_s: float = 4 * 3600.0
    #: False: leave out Wait decisions of jobs that stay where they are (the simulator does not
    #: need them; the live leader wants every reason).
    explain_waits: bool = True


@dataclass(frozen=True)
class JobView:
    """What the policy needs to know about a job.

    ``priority`` is the declared level (never AUTO: resolve that at submit, :func:`resolve_auto`).
    ``nodes`` is the size asked for; an elastic job also sets ``min_nodes``/``max_nodes`` (0: same
    as ``nodes``). ``held`` are the nodes of the current run (its length is the running size).
    ``run_s`` is the time the job ran in earlier runs of its chain, not counting the current one.
    ``queued_ts`` is when a waiting job last entered the queue (0: at ``submit_ts``).
    """

    id: str
    user: str
    priority: int
    nodes: int
    submit_ts: float
    state: ChainState
    group: str = "default"
    held: tuple[str, ...] = ()
    started_ts: float = 0.0
    slice_turns: int = 0
    min_nodes: int = 0
    max_nodes: int = 0
    run_s: float = 0.0
    queued_ts: float = 0.0
    #: Submitted by an operator: the levels closed by default (Quotas.closed_above) are open to it.
    exempt: bool = False
    # Worked out once per view (a round reads them millions of times in a replay):
    lo: int = field(init=False, repr=False, compare=False)  # fewest nodes the job can run on
    hi: int = field(init=False, repr=False, compare=False)  # most nodes the job can use
    size: int = field(init=False, repr=False, compare=False)  # nodes it holds now, else asks for

    def __post_init__(self) -> None:
        lo = self.min_nodes or self.nodes
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", max(self.max_nodes or self.nodes, lo))
        object.__setattr__(self, "size", len(self.held) or self.nodes)

    @property
    def waited_since(self) -> float:
        """When it last entered the queue (submit or requeue)."""
        return self.queued_ts or self.submit_ts


@dataclass(frozen=True)
class NodeView:
    name: str
    group: str = "default"
    schedulable: bool = True


@dataclass(frozen=True)
class Start:
    """Run the job on ``nodes`` (rank order); ``len(nodes)`` is its world size this run."""

    job_id: str
    nodes: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class Suspend:
    """Interrupt the job (checkpoint, release the nodes) and requeue it keeping its place."""

    job_id: str
    reason: str
    for_job: str
    # True when the job yields to an equal-priority job (it then moves back in the round-robin).
    sliced: bool = False


@dataclass(frozen=True)
class Resize(Suspend):
    """An elastic job changes size: interrupt it exactly like :class:`Suspend`; the policy then
    restarts it (a :class:`Start`) with about ``size`` nodes and a new world size. ``for_job`` is
    empty when it grows into idle nodes."""

    size: int = 0


@dataclass(frozen=True)
class Wait:
    job_id: str
    reason: str


Decision = Start | Suspend | Wait


_ABOVE_NORMAL = Priority.ABOVE_NORMAL.value


def effective_priority(job: JobView, now: float, config: PolicyConfig) -> int:
    """The priority the job is scheduled at: ABOVE_NORMAL decays to NORMAL after running
    ``config.above_normal_s`` in total, so nobody holds the cluster at that level for ever."""
    if job.priority != _ABOVE_NORMAL or config.above_normal_s == math.inf:
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
        return service_band(v, 0.0, config) * _BAND_WEIGHT + v.submit_ts

    return priority_ordering(config.above_normal_s, key, ("bands", config.slice_s, config.service_bands))


#: Far more than any submit time (seconds since 1970 stay below 1e11 until the year 5138).
_BAND_WEIGHT = 1e11


def indexed(jobs: Iterable[JobView] | JobIndex, order: Ordering) -> JobIndex:
    """``jobs`` as an index in ``order``: itself if it already is one."""
    if isinstance(jobs, JobIndex):
        if jobs.signature == order.signature:
            return jobs
        jobs = jobs.views()
    return JobIndex.of(jobs, order)


def decide(jobs: Iterable[JobView] | JobIndex, nodes: Iterable[NodeView], now: float,
           config: PolicyConfig) -> list[Decision]:
    """All decisions for this moment. Deterministic for the same inputs.

    ``jobs`` is either the live jobs or a :class:`~hfai.controller.queues.JobIndex` of them kept
    between rounds (what the leader and the simulator pass: a round then costs what it touches)."""
    jobs = indexed(jobs, ordering(config))
    layout = jobs.layout(nodes)
    free = jobs.free_nodes(nodes)
    decisions: list[Decision] = []
    for group in sorted(jobs.groups):
        g = jobs.groups[group]
        if g.levels or g.growable:  # something waits, or an elastic job can grow
            decisions.extend(_GroupRound(g, layout.usable.get(group, []), free.get(group, []), jobs, group, now,
                                         config).run())
    return decisions


#: Rounding margin of :func:`quiet_until` (and the LAS baseline's): a threshold crossing worked
#: out by another formula than the one a round evaluates may land an ulp early.
QUIET_MARGIN_S = 1e-6


def quiet_until(jobs: JobIndex, now: float, config: PolicyConfig) -> float:
    """The earliest time after ``now`` at which :func:`decide` could decide otherwise with the
    jobs as they are: a running job holding its nodes a slice (it may be sliced, or grow), or
    entering the next service band, an ABOVE_NORMAL job decaying. Every other input of a round
    is a record or a node. The simulator skips its periodic rounds before it after a round that
    changed nothing: such rounds would change nothing either."""
    t = math.inf
    slice_s, bands = config.slice_s, config.service_bands
    decays = config.above_normal_s != math.inf
    for g in jobs.groups.values():
        for j in g.running.values():
            if slice_s > 0:
                at = j.started_ts + slice_s
                if now < at < t:
                    t = at
                band = service_band(j, now, config)
                if band < len(bands):  # when its node-time reaches the next band
                    at = j.started_ts + bands[band] * slice_s / j.size - j.run_s
                    if now < at < t:
                        t = at
            if decays and j.priority == _ABOVE_NORMAL:
                at = j.started_ts + config.above_normal_s - j.run_s
                if now < at < t:
                    t = at
    # Not a term: the end of a user's backfill window (own_backfill_s) only forbids starts, so it
    # cannot make a round act that would not have.
    return t - QUIET_MARGIN_S


decide.quiet_until = quiet_until  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------- victim pool


@dataclass
class _Level:
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
    banded: bool = False  # the service bands of ``sliceable`` worked out (_Pool.banded)
    # Nodes of the untaken sliceable jobs per service band, and per user and band (once banded):
    # "how much could a job of user U in band b take" is a sum over the few bands above b.
    band_nodes: list[int] = field(default_factory=list)
    user_band_nodes: dict[str, list[int]] = field(default_factory=dict)


class _Pool:
    """Running jobs of one group that may still be chosen as victims, with quick totals. Built in
    one pass; a level's candidate lists are sorted only when a victim is looked for there."""

    def __init__(self, running: Iterable[JobView], now: float, config: PolicyConfig):
        self.prio: dict[str, int] = {}  # effective priority of every running job
        self.band: dict[str, int] = {}  # of the sliceable running jobs, per level when first needed
        self.levels: dict[int, _Level] = {}
        cutoff = now - config.slice_s
        levels, prio = self.levels, self.prio
        decays = config.above_normal_s != math.inf
        for j in running:
            p = prio[j.id] = effective_priority(j, now, config) if decays else j.priority
            level = levels.get(p)
            if level is None:
                level = levels[p] = _Level(jobs=[])
            level.jobs.append(j)
            n = len(j.held)
            level.nodes += n
            if j.started_ts <= cutoff:
                level.sliceable.append(j)
                level.slice_nodes += n
            else:
                level.unripe.append(j)
        self.order = sorted(levels)
        self.now, self.config = now, config
        self.taken: set[str] = set()
        self.lower_cache: dict[int, int] = {}

    def banded(self, level: _Level) -> dict[str, int]:
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

    def sorted_level(self, p: int) -> _Level:
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

    def untaken(self, level: _Level, sliceable: bool) -> Iterator[JobView]:
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


# --------------------------------------------------------------------------------- one group


@dataclass
class _Victim:
    job: JobView
    gives: int  # nodes it frees for the waiting job
    sliced: bool
    shrink: bool


class _GroupRound:
    """One scheduling round in one node group. Holds the running state of the scan so each step
    is a small method; ``run`` returns the decisions."""

    def __init__(self, jobs: GroupJobs, usable_names: list[str], free: list[str], index: JobIndex, group: str,
                 now: float, config: PolicyConfig):
        self.group, self.now, self.config = group, now, config
        self.jobs = jobs
        self.used: dict[tuple[str, int, str], int] = defaultdict(int, index.used)  # plus this round's starts
        self.usable = len(usable_names)
        self.free = free  # sorted by name; shared with the index: read, never changed
        self.fi = 0  # free[:fi] are taken or pinned this round
        self.pinned = 0  # of those, pinned for a blocked job (not started on): "reserved"
        self.leaving = 0
        if jobs.leaving:
            usable = set(usable_names)
            self.leaving = sum(sum(1 for n in j.held if n in usable) for j in jobs.leaving.values())
        self.pool = _Pool(jobs.running.values(), now, config)
        # Effective priorities: of the running jobs (the pool's), and of each waiting job looked at.
        self.prio = self.pool.prio
        # Soft reservation (rule 6): the lowest priority of a blocked job.
        self.floor_prio: int | None = None
        self.blocked = False  # some job waits for nodes (not for quota): no growth this round
        self.starts: list[tuple[JobView, list[str]]] = []
        self.started: set[str] = set()
        self.out: list[Decision] = []
        self.turns: dict[tuple[int, str, int, int], float | None] = {}  # slice_turn's answers this round
        self.wband: dict[str, int] = {}  # service band of the waiting jobs looked at (explaining)
        self.p = 0  # the level being walked (quiet walk)
        self.stuck_users: set[str] = set()  # of the level being walked: see walk()
        self.failed_size: dict[str, int] = {}
        self.ready: dict[tuple[int, str, int, int], tuple[list[float], list[int]]] = {}  # see ready_times
        self.reasons: dict[tuple, str] = {}  # skip's reasons this round, while nothing changed

    # -- helpers

    def n_free(self) -> int:
        return len(self.free) - self.fi

    def take_free(self, k: int) -> list[str]:
        got = self.free[self.fi:self.fi + k]
        self.fi += k
        return got

    def room(self, job: JobView) -> int | None:
        """Nodes the job may still add under its quota (None: no limit)."""
        limit = self.config.quotas.limit(job.user, job.priority, self.group, job.exempt)
        if limit is None:
            return None
        return limit - self.used.get((job.user, job.priority, self.group), 0)

    def wait(self, job: JobView, reason: str, *, quiet: bool = False) -> None:
        if self.config.explain_waits or not quiet:
            self.out.append(Wait(job.id, reason))

    def cap(self, p: int) -> int:
        """At most how many nodes a job at priority ``p`` could still get this round: free, being
        released, and held by jobs it could preempt (of any user: an upper bound)."""
        return self.n_free() + self.leaving + self.pool.most_nodes(p)

    def hopeless(self, p: int) -> bool:
        """No job at priority ``p`` can start or preempt anything any more this round."""
        return self.fi >= len(self.free) and self.leaving == 0 and not self.pool.could_take_any(p)

    def may_backfill(self, job: JobView) -> bool:
        """A job behind a blocked one may use free nodes only if that one could take them back:
        a lower priority, or the same priority and another user. Its own user's jobs at that
        priority may, until the user's first job in line there has waited ``own_backfill_s``
        (unless that one started this round)."""
        if self.floor_prio is None:
            return True
        p = self.prio[job.id]
        if p != self.floor_prio:
            return p < self.floor_prio
        head = self.jobs.levels[p].user_head(job.user)
        if head is None or head[1] == job.id or head[1] in self.started:
            return True
        first = self.jobs.levels[p].views[head[1]]
        return self.now - first.waited_since < self.config.own_backfill_s

    def reserve(self, p: int) -> None:
        """A job at ``p`` is blocked for want of nodes: later jobs may only backfill (rule 6)."""
        self.blocked = True
        if self.floor_prio is None or p < self.floor_prio:
            self.floor_prio = p

    # -- the round

    def run(self) -> list[Decision]:
        for p in sorted(self.jobs.levels, reverse=True):
            self.walk(self.jobs.levels[p], p)
        self.widen_starts()
        if not self.blocked:
            self.grow_running()
        self.out.extend(Start(j.id, tuple(ns), "nodes free" if len(ns) == j.size else
                              f"nodes free ({len(ns)} of {j.lo}..{j.hi})") for j, ns in self.starts)
        return self.out

    def walk(self, level: Level, p: int) -> None:
        """The jobs of one level in queue order. A job that needs more nodes than :meth:`cap`
        cannot start or preempt: it is only blocked. Explaining, every job is looked at; quiet (the
        simulator, and the leader between explanations), a merge of the level's per-size lists
        visits only jobs that could get nodes, so a long queue behind a full cluster costs O(1)
        per size, not O(jobs). Both make the same non-Wait decisions."""
        if self.config.explain_waits:
            # Every waiting job gets its reason: O(queue), so kept tight. The cap changes only
            # when something starts, is taken or is pinned (``state``).
            views, prio, wband, reasons, out = level.views, self.prio, self.wband, self.reasons, self.out
            state: tuple[int, int, int] | None = None
            cap = 0
            for key, job_id in level.keys_in_order():
                job = views[job_id]
                prio[job_id] = p
                band = wband[job_id] = int(key // _BAND_WEIGHT)  # the ordering's key holds the band
                now_state = (self.fi, self.leaving, len(self.pool.taken))
                if now_state != state:
                    state, cap = now_state, self.cap(p)
                if job.lo > cap:
                    self.reserve(p)
                    # A long tail repeats a few situations: the reason depends only on these.
                    memo = (p, job.lo, job.user, job.priority, band, state)
                    reason = reasons.get(memo)
                    if reason is None:
                        reason = reasons[memo] = self.skip_reason(job, p)
                    out.append(Wait(job_id, reason))
                else:
                    self.place(job)
            return
        self.stuck_users.clear()
        self.failed_size.clear()
        self.p = p
        for found, passed in level.fitting(lambda: self.cap(p), self.left_out):
            if passed:
                self.reserve(p)  # a job ahead was passed over: it is blocked
            if found is None:
                return
            self.prio[found.id] = p  # place() reads it (left_out sets it only on some paths)
            self.place(found)

    def left_out(self, job: JobView, key: Key) -> int | None:
        """Quiet walk: None if :meth:`place` could start the job or preempt for it; else from
        which size on the user's jobs at this level are left out (0: all of them). Every job
        left out would only have been blocked (the walk reserves for a job passed over), and so
        would the user's later jobs from that size on: they come later in line, so they are in
        the same service band or a higher one (fewer victims), behind the same first job of the
        user, and free nodes, victims and quota room only shrink during a round. A job that
        :meth:`place` explains otherwise (too big for the group, over quota) goes through.
        The level walked is ``self.p``."""
        p, user, lo = self.p, job.user, job.lo
        if user in self.stuck_users:
            return 0
        if lo >= self.failed_size.get(user, lo + 1):
            return self.failed_size[user]
        free = len(self.free) - self.fi + self.leaving
        pool = self.pool
        lower = pool.lower_nodes(p)
        level = pool.levels.get(p)
        if lo > free + lower + (level.slice_nodes if level is not None else 0):  # > self.cap(p)
            return self.blocked_from(job, p)
        if lo > self.usable:
            return None
        room = self.room(job)
        if room is not None and room < lo:
            return None
        self.prio[job.id] = p
        if not self.may_backfill(job):
            return 0  # it waits behind its user's first job in line here, and so do the rest
        if lo <= free or lo <= free + lower + pool.slice_nodes(p, user, int(key[0] // _BAND_WEIGHT)):
            return None
        return self.blocked_from(job, p)

    def blocked_from(self, job: JobView, p: int) -> int:
        """The job is blocked for want of nodes: reserve for it now (as :meth:`place` would), and
        say from which size on its user's jobs here are left out: all of them if it is the
        user's first in line and has waited ``own_backfill_s`` (none behind it may backfill)."""
        self.reserve(p)
        head = self.jobs.levels[p].user_head(job.user)
        if head is not None and head[1] == job.id and self.now - job.waited_since >= self.config.own_backfill_s:
            return 0
        return job.lo

    def skip_reason(self, job: JobView, p: int) -> str:
        lo = job.lo
        room = self.room(job)
        if lo > self.usable:
            return f"needs {lo} nodes, group {self.group!r} has {self.usable} usable"
        if room is not None and room < lo:
            return self.over_quota(job, room)
        need = lo - self.n_free() - self.leaving
        if self.hopeless(p):
            fallback = f"waiting for nodes: {self.why_no_free()}, and no running job may be preempted for it"
        else:
            fallback = f"waiting for {need} more node(s), held by jobs it may not preempt"
        return self.slice_wait(job, need - self.pool.lower_nodes(p) - self.slices(job, p)) or fallback

    def over_quota(self, job: JobView, room: int) -> str:
        held = self.used.get((job.user, job.priority, self.group), 0)
        if self.config.quotas.closed_by_default(job.user, job.priority, self.group, job.exempt):
            return (f"over quota: {Priority.label(job.priority)} needs a quota and user {job.user!r} has none "
                    f"in group {self.group!r} (levels above {Priority.label(self.config.quotas.closed_above or 0)} "
                    f"are closed until an operator sets one; or hfai update {job.id} -p NORMAL)")
        return (f"over quota: user {job.user!r} holds {held} of {room + held} node(s) at "
                f"{Priority.label(job.priority)} in group {self.group!r}, job needs {job.lo}")

    def place(self, job: JobView) -> None:
        lo = job.lo
        if lo > self.usable:
            self.wait(job, f"needs {lo} nodes, group {self.group!r} has {self.usable} usable")
            return
        room = self.room(job)
        if room is not None and room < lo:
            self.wait(job, self.over_quota(job, room))
            return
        if lo <= self.n_free() and self.may_backfill(job):
            key = (job.user, job.priority, self.group)
            self.used[key] = self.used.get(key, 0) + lo
            self.starts.append((job, self.take_free(lo)))
            self.started.add(job.id)
            return
        self.blocked = True
        if self.hopeless(self.prio[job.id]):
            # Cheap path for the long tail of a full cluster: nothing this job could do.
            if self.config.explain_waits:
                self.wait(job, self.slice_wait(job, job.lo) or
                          f"waiting for nodes: {self.why_no_free()}, and no running job may be preempted for it",
                          quiet=True)
            self.reserve(self.prio[job.id])
            return
        self.claim(job)

    def claim(self, job: JobView) -> None:
        """Blocked: count free and leaving nodes, then victims; pin what it counts on if it can
        get enough, else leave a soft reservation."""
        if not self.may_backfill(job):
            # Whatever it freed (free nodes, victims) would go to that job ahead of it: preempting
            # for it would only churn (victims restarting on nodes this job may not use).
            self.stuck_users.add(job.user)
            self.wait(job, "waiting behind an earlier job of the same user and priority that waits for nodes",
                      quiet=True)
            return
        need = job.lo - self.n_free()
        from_leaving = min(need, self.leaving)
        if need - from_leaving <= 0:
            self.leaving -= from_leaving
            self.pin_free(job)
            self.wait(job, "waiting for nodes that are being released", quiet=True)
            return
        victims = self.choose_victims(job, need - from_leaving)
        if victims is None:
            if self.config.explain_waits:
                p = self.prio[job.id]
                short = need - from_leaving - self.pool.lower_nodes(p) - self.slices(job, p)
                self.wait(job, self.slice_wait(job, short) or
                          f"waiting for {need - from_leaving} more node(s), held by jobs it may not preempt",
                          quiet=True)
            self.reserve(self.prio[job.id])
            # Free and preemptible nodes only shrink this round: the user's later, not smaller,
            # jobs here (same band or higher: fewer victims) cannot gather theirs either.
            self.failed_size[job.user] = min(self.failed_size.get(job.user, job.lo), job.lo)
            return
        self.leaving -= from_leaving
        self.pin_free(job)
        for v in victims:
            self.pool.take(v.job)
            self.out.append(self.victim_decision(job, v))
        self.turns.clear()  # victims are no longer anybody's turn
        self.wait(job, "waiting for preempted jobs to checkpoint and release their nodes")

    def slice_wait(self, job: JobView, short: int) -> str | None:
        """The wait reason of a job that time slicing will serve, or None: other users' jobs of
        its priority that may not be sliced for it yet (held their nodes less than a slice, or
        have had no more service than it) hold at least the ``short`` nodes it lacks beyond what
        it could take now. Its turn comes when enough of them may."""
        if short <= 0:
            return None
        p = self.prio[job.id]
        band = self.band_of(job)
        key = (p, job.user, short, band)
        if key not in self.turns:
            self.turns[key] = self.slice_turn(p, job.user, short, band)
        turn = self.turns[key]
        if turn is None:
            return None
        return f"{TIME_SLICE_WAIT}, next turn in ~{max(1, math.ceil(turn / 60))} min"

    def slice_turn(self, p: int, user: str, short: int, band: int) -> float | None:
        """Seconds until running jobs of priority ``p`` and other users than ``user`` will have
        become sliceable for a job in service band ``band`` holding ``short`` nodes; None if they
        never can (the job is in the last band, or too few nodes are held by others)."""
        if p not in self.pool.levels or band >= len(self.config.service_bands):
            return None
        key = (p, user, band, len(self.pool.taken))
        ready = self.ready.get(key)
        if ready is None:
            ready = self.ready[key] = self.ready_times(p, user, band)
        times, nodes = ready
        i = bisect.bisect_left(nodes, short)
        return max(0.0, times[i] - self.now) if i < len(nodes) else None

    def ready_times(self, p: int, user: str, band: int) -> tuple[list[float], list[int]]:
        """When other users' jobs at ``p`` that may not be sliced for band ``band`` yet may be
        (held their nodes a slice, and their service left the band), in order, with the running
        total of their nodes."""
        threshold = self.config.service_bands[band] * self.config.slice_s  # node-seconds to leave the band
        ready: list[tuple[float, int]] = []
        for v in self.pool.sorted_level(p).jobs:
            if v.user == user or v.id in self.pool.taken:
                continue
            if v.id in self.pool.band and self.pool.band[v.id] > band:
                continue  # sliceable now: already counted
            past_band = v.started_ts + max(0.0, threshold / max(1, len(v.held)) - v.run_s)
            ready.append((max(v.started_ts + self.config.slice_s, past_band), len(v.held)))
        ready.sort()
        times, totals, got = [], [], 0
        for at, n in ready:
            got += n
            times.append(at)
            totals.append(got)
        return times, totals

    def slices(self, job: JobView, p: int) -> int:
        """Nodes the job could take from its own priority by time slicing."""
        return self.pool.slice_nodes(p, job.user, self.band_of(job))

    def band_of(self, job: JobView) -> int:
        band = self.wband.get(job.id)
        return service_band(job, self.now, self.config) if band is None else band

    def pin_free(self, job: JobView) -> None:
        self.pinned += len(self.free) - self.fi
        self.fi = len(self.free)

    def why_no_free(self) -> str:
        """Why no free node is left for a job (the round has none left): some were pinned for a
        blocked job ahead of it, or there were none, or this round's starts took them."""
        return "the free nodes are reserved for jobs ahead of it" if self.pinned else "the group is full"

    def victim_decision(self, job: JobView, v: _Victim) -> Suspend:
        vp, jp = self.prio[v.job.id], self.prio[job.id]
        if v.sliced:
            why = (f"time slice: yields to job {job.id} of equal priority and less service so far after "
                   f"{(self.now - v.job.started_ts) / 60:.1f} min")
        else:
            why = f"preempted by job {job.id} (priority {_label(jp)} > {_label(vp)})"
        if v.shrink:
            size = len(v.job.held) - v.gives
            return Resize(v.job.id, f"{why}: shrinks to {size} node(s)", for_job=job.id, sliced=v.sliced, size=size)
        return Suspend(v.job.id, why, for_job=job.id, sliced=v.sliced)

    def choose_victims(self, job: JobView, need: int) -> list[_Victim] | None:
        """Jobs (or elastic surplus) whose nodes add up to ``need``, cheapest first; None if
        impossible. Victims that turn out not to be needed are dropped again."""
        p = self.prio[job.id]
        if self.pool.lower_nodes(p) + self.slices(job, p) < need:
            return None
        chosen: list[_Victim] = []
        left = need
        for v in self.candidates(job, p):
            gives = len(v.held)
            shrink = v.hi > v.lo and len(v.held) - v.lo >= left
            if shrink:
                gives = left
            chosen.append(_Victim(v, gives, sliced=self.prio[v.id] == p, shrink=shrink))
            left -= gives
            if left <= 0:
                return _drop_unneeded(chosen, need)
        return None

    def candidates(self, job: JobView, p: int) -> Iterator[JobView]:
        pool = self.pool
        for prio in pool.order:
            if prio >= p:
                break
            yield from pool.untaken(pool.sorted_level(prio), sliceable=False)
        if p in pool.levels:
            level = pool.sorted_level(p)
            # Among equals: only other users' jobs with more attained service yield (most first).
            band = self.band_of(job)
            for v in pool.untaken(level, sliceable=True):
                if v.user != job.user and pool.band[v.id] > band:
                    yield v

    # -- elastic

    def widen_starts(self) -> None:
        """Elastic jobs started this round take idle nodes up to their maximum, once every waiting
        job had its turn and none is blocked (so the extra nodes are not anybody's reservation)."""
        if self.blocked:
            return
        for job, ns in self.starts:
            extra = min(job.hi - len(ns), self.n_free())
            room = self.room(job)
            if room is not None:
                extra = min(extra, room)
            if extra > 0:
                ns.extend(self.take_free(extra))
                self.used[(job.user, job.priority, self.group)] += extra

    def grow_running(self) -> None:
        """Nothing waits: restart running elastic jobs that ran a slice at a size that uses idle
        nodes, oldest first, if the gain is worth a restart."""
        for job in sorted(self.jobs.running.values(), key=lambda j: (j.started_ts, j.id)):
            if len(job.held) >= job.hi or self.now - job.started_ts < self.config.slice_s:
                continue
            extra = min(job.hi - len(job.held), self.n_free())
            room = self.room(job)
            if room is not None:
                extra = min(extra, room)
            if extra < max(1.0, self.config.grow_min_gain * len(job.held)):
                continue
            self.take_free(extra)  # set aside for its restart
            self.used[(job.user, job.priority, self.group)] += extra
            size = len(job.held) + extra
            self.out.append(Resize(job.id, f"grows from {len(job.held)} to {size} nodes into idle nodes",
                                   for_job="", size=size))


@functools.cache
def _label(priority: int) -> str:
    """Priority.label, kept: a round that preempts a thousand jobs names two levels for each."""
    return Priority.label(priority)


def _drop_unneeded(chosen: list[_Victim], need: int) -> list[_Victim]:
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
