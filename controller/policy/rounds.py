"""hfai's policy: :func:`decide` runs one :class:`GroupRound` per node group (the rules of
:mod:`hfai.controller.policy`), and :func:`quiet_until` says how long its decisions stay the same."""

from __future__ import annotations

import bisect
import functools
import math
from collections import defaultdict
from collections.abc import Iterable, Iterator

from hfai.controller.policy.interface import FunctionPolicy, Policy
from hfai.controller.policy.rules import ABOVE_NORMAL, BAND_WEIGHT, indexed, ordering, service_band
from hfai.controller.policy.victims import Victim, VictimPool, drop_unneeded
from hfai.controller.policy.views import Decision, JobView, NodeView, PolicyConfig, Resize, Start, Suspend, Wait
from hfai.controller.queues import GroupJobs, JobIndex, Key, Level
from hfai.protocol import reasons
from hfai.protocol.reasons import Reason
from hfai.protocol.types import Priority


def decide(jobs: Iterable[JobView] | JobIndex, nodes: Iterable[NodeView], now: float,
           config: PolicyConfig) -> list[Decision]:
    """All decisions for this moment. Deterministic for the same inputs.

    ``jobs`` is either the live jobs or a :class:`~hfai.controller.queues.JobIndex` of them kept
    between rounds (what the leader and the simulator pass: a round then costs what it touches)."""
    return decide_with(GroupRound, jobs, nodes, now, config)


def decide_with(round_cls: type[GroupRound], jobs: Iterable[JobView] | JobIndex, nodes: Iterable[NodeView],
                now: float, config: PolicyConfig) -> list[Decision]:
    """:func:`decide` with each group's round made by ``round_cls`` (the gain policy's rounds,
    controller/policy/gain.py, differ from hfai's only in how elastic jobs are sized)."""
    jobs = indexed(jobs, ordering(config))
    layout = jobs.layout(nodes)
    free = jobs.free_nodes(nodes)
    decisions: list[Decision] = []
    for group in sorted(jobs.groups):
        g = jobs.groups[group]
        if g.levels or g.growable:  # something waits, or an elastic job can grow
            decisions.extend(round_cls(g, layout.usable.get(group, []), free.get(group, []), jobs, group, now,
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
            if decays and j.priority == ABOVE_NORMAL:
                at = j.started_ts + config.above_normal_s - j.run_s
                if now < at < t:
                    t = at
    # Not a term: the end of a user's backfill window (own_backfill_s) only forbids starts, so it
    # cannot make a round act that would not have.
    return t - QUIET_MARGIN_S


class GroupRound:
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
        self.pool = VictimPool(jobs.running.values(), now, config)
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
        self.reasons: dict[tuple, Reason] = {}  # skip's reasons this round, while nothing changed
        self._sessions: dict[str, list[JobView]] | None = None  # see sessions_of

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

    def wait(self, job: JobView, why: Reason, *, quiet: bool = False) -> None:
        if self.config.explain_waits or not quiet:
            self.out.append(Wait(job.id, why))

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
            views, prio, wband, memos, out = level.views, self.prio, self.wband, self.reasons, self.out
            state: tuple[int, int, int] | None = None
            cap = 0
            for key, job_id in level.keys_in_order():
                job = views[job_id]
                prio[job_id] = p
                band = wband[job_id] = int(key // BAND_WEIGHT)  # the ordering's key holds the band
                now_state = (self.fi, self.leaving, len(self.pool.taken))
                if now_state != state:
                    state, cap = now_state, self.cap(p)
                if job.lo > cap:
                    self.reserve(p)
                    # A long tail repeats a few situations: the reason depends only on these.
                    memo = (p, job.lo, job.user, job.priority, band, state)
                    why = memos.get(memo)
                    if why is None:
                        why = memos[memo] = self.skip_reason(job, p)
                    out.append(Wait(job_id, why))
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
        if lo <= free or lo <= free + lower + pool.slice_nodes(p, user, int(key[0] // BAND_WEIGHT)):
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

    def skip_reason(self, job: JobView, p: int) -> Reason:
        lo = job.lo
        room = self.room(job)
        if lo > self.usable:
            return self.too_big(job)
        if room is not None and room < lo:
            return self.over_quota(job, room)
        need = lo - self.n_free() - self.leaving
        fallback = self.no_nodes() if self.hopeless(p) else reasons.not_preemptible(need=need)
        short = need - self.pool.lower_nodes(p) - self.slices(job, p)
        return self.own_session(job, short) or self.slice_wait(job, short) or fallback

    # -- wait reasons that both walks give (the explaining walk's skip_reason, and place)

    def too_big(self, job: JobView) -> Reason:
        return reasons.too_big(need=job.lo, group=self.group, usable=self.usable)

    def over_quota(self, job: JobView, room: int) -> Reason:
        held = self.used.get((job.user, job.priority, self.group), 0)
        if self.config.quotas.closed_by_default(job.user, job.priority, self.group, job.exempt):
            return reasons.quota_closed(user=job.user, priority=Priority.label(job.priority), group=self.group,
                                        closed_above=Priority.label(self.config.quotas.closed_above or 0), job=job.id)
        return reasons.over_quota(user=job.user, held=held, limit=room + held, priority=Priority.label(job.priority),
                                  group=self.group, need=job.lo)

    def no_nodes(self) -> Reason:
        """No free node is left for a job and it can preempt nothing: some were pinned for a
        blocked job ahead of it, or there were none, or this round's starts took them."""
        return _RESERVED if self.pinned else _FULL

    def place(self, job: JobView) -> None:
        lo = job.lo
        if lo > self.usable:
            self.wait(job, self.too_big(job))
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
                why = self.own_session(job, job.lo) or self.slice_wait(job, job.lo) or self.no_nodes()
                self.wait(job, why, quiet=True)
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
            self.wait(job, _BEHIND_OWN_JOB, quiet=True)
            return
        need = job.lo - self.n_free()
        from_leaving = min(need, self.leaving)
        if need - from_leaving <= 0:
            self.leaving -= from_leaving
            self.pin_free(job)
            self.wait(job, _RELEASING, quiet=True)
            return
        victims = self.choose_victims(job, need - from_leaving)
        if victims is None:
            if self.config.explain_waits:
                p = self.prio[job.id]
                short = need - from_leaving - self.pool.lower_nodes(p) - self.slices(job, p)
                self.wait(job, self.own_session(job, short) or self.slice_wait(job, short) or
                          reasons.not_preemptible(need=need - from_leaving), quiet=True)
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
        self.wait(job, _PREEMPTING)

    def own_session(self, job: JobView, short: int) -> Reason | None:
        """The wait reason of a job whose own user's development sessions hold the ``short`` nodes
        it lacks beyond what it could take now, at a priority it may not preempt (a LOW job that
        its user's session preempted): they are named, as is the time slice's turn if one comes
        sooner or later; None otherwise. "Waiting for its time slice" alone hid that the user's
        own session holds the node, and that ending it would start the job."""
        if short <= 0:
            return None
        sessions = self.sessions_of().get(job.user)
        if not sessions:
            return None
        p = self.prio[job.id]
        holding = [s for s in sessions if self.prio.get(s.id, s.priority) >= p and s.id not in self.pool.taken]
        nodes = [n for s in holding for n in s.held]
        if len(nodes) < short:
            return None
        first = holding[0]
        return reasons.own_session(job=first.id, name=first.name or first.id, nodes=", ".join(nodes),
                                   priority=_label(self.prio.get(first.id, first.priority)),
                                   minutes=self.slice_minutes(job, short))

    def sessions_of(self) -> dict[str, list[JobView]]:
        """The running development sessions of this group by user, oldest first (made once a round)."""
        if self._sessions is None:
            self._sessions = {}
            for j in sorted((j for j in self.jobs.running.values() if j.dev), key=lambda j: (j.started_ts, j.id)):
                self._sessions.setdefault(j.user, []).append(j)
        return self._sessions

    def slice_wait(self, job: JobView, short: int) -> Reason | None:
        """The wait reason of a job that time slicing will serve, or None: other users' jobs of
        its priority that may not be sliced for it yet (held their nodes less than a slice, or
        have had no more service than it) hold at least the ``short`` nodes it lacks beyond what
        it could take now. Its turn comes when enough of them may."""
        minutes = self.slice_minutes(job, short)
        return None if minutes is None else reasons.time_slice_wait(minutes=minutes)

    def slice_minutes(self, job: JobView, short: int) -> int | None:
        """Minutes (at least 1) until the job's time slice comes, as :meth:`slice_wait` says;
        None: it does not."""
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
        return max(1, math.ceil(turn / 60))

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

    def victim_decision(self, job: JobView, v: Victim) -> Suspend:
        vp, jp = self.prio[v.job.id], self.prio[job.id]
        size = len(v.job.held) - v.gives if v.shrink else None
        lost = self.shrink_loss(v.job, size) if size else None
        unit = v.job.throughput_unit if lost is not None else ""
        if v.sliced:
            why = reasons.time_slice(job=job.id, minutes=(self.now - v.job.started_ts) / 60, size=size, lost=lost,
                                     unit=unit)
        else:
            why = reasons.preempted(job=job.id, priority=_label(jp), victim_priority=_label(vp), size=size, lost=lost,
                                    unit=unit)
        if size is not None:
            return Resize(v.job.id, why, for_job=job.id, sliced=v.sliced, size=size)
        return Suspend(v.job.id, why, for_job=job.id, sliced=v.sliced)

    def shrink_loss(self, victim: JobView, size: int) -> int | None:
        """What the nodes a victim shrunk to ``size`` gives up added, % of its throughput, for its
        reason to say; None: this policy does not know (hfai's rules have no speedup curves)."""
        return None

    def choose_victims(self, job: JobView, need: int) -> list[Victim] | None:
        """Jobs (or elastic surplus) whose nodes add up to ``need``, cheapest first; None if
        impossible. Victims that turn out not to be needed are dropped again."""
        p = self.prio[job.id]
        if self.pool.lower_nodes(p) + self.slices(job, p) < need:
            return None
        chosen: list[Victim] = []
        left = need
        for v in self.candidates(job, p):
            gives = len(v.held)
            shrink = v.hi > v.lo and len(v.held) - v.lo >= left
            if shrink:
                gives = left
            chosen.append(Victim(v, gives, sliced=self.prio[v.id] == p, shrink=shrink))
            left -= gives
            if left <= 0:
                return drop_unneeded(chosen, need)
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
            self.out.append(Resize(job.id, reasons.grows(held=len(job.held), size=size), for_job="",
                                   size=size))


@functools.cache
def _label(priority: int) -> str:
    """Priority.label, kept: a round that preempts a thousand jobs names two levels for each."""
    return Priority.label(priority)



_FULL = reasons.no_nodes(reserved=False)
_RESERVED = reasons.no_nodes(reserved=True)
_BEHIND_OWN_JOB = reasons.behind_own_job()
_RELEASING = reasons.releasing()
_PREEMPTING = reasons.preempting()

#: hfai's policy, as the leader runs it (and the simulator under the name "hfai").
HFAI: Policy = FunctionPolicy("hfai", decide, ordering, quiet_until)
