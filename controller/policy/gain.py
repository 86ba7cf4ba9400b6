"""The gain policy: hfai's rules, with elastic jobs sized by what their next node adds.

Every rule of :mod:`~hfai.controller.policy.rounds` holds as it is (priorities, FIFO within
service bands, quotas, gangs, slices, reservations and backfill): a :class:`GainRound` is a
:class:`~hfai.controller.policy.rounds.GroupRound` that differs only where hfai's round assumes
that every job speeds up linearly with its nodes. Each elastic job's speedup curve is fitted to
the throughput it was measured at (:mod:`~hfai.controller.policy.speedup`, a prior for sizes
not yet seen), and

* idle nodes go to the elastic jobs started this round one at a time, each to the job whose next
  node adds the most throughput (in one-node throughputs of that job), as long as a node adds at
  least ``node_gain_min``: a node that adds less stays free for the next arrival instead of
  being taken back by a shrink (a restart) when it comes;
* a running elastic job grows into idle nodes only when the progress it gains over the coming
  slice pays for the restart: ``S(n+k) * (slice_s - resize_cost_s) > S(n) * slice_s``, with at
  least ``grow_min_gain`` more throughput; the jobs whose added nodes gain the most go first;
* when nodes are contended (a waiting job preempts or slices), among the victims the rules allow
  at one priority, elastic jobs whose surplus nodes add the least give them first (a shrink,
  instead of suspending a whole job);
* nodes move between running elastic jobs (nothing waits for them): the job whose last nodes
  add least is shrunk so that one whose next nodes add most can grow, when the one's gain over
  the coming slice beats the other's loss, restarts included, and only as a time slice would
  allow it (the shrunk job held its nodes a slice, is of another user, of no higher priority and
  has had no less service). Each job is resized at most once a slice, so interruptions stay few.

Without measurements at two sizes (the prior is linear by default), or with linear ones, it decides
exactly as hfai does; tests/test_elastic_gain.py checks that, and the rules above.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import replace

from hfai.controller.policy.interface import FunctionPolicy, Policy
from hfai.controller.policy.rounds import HFAI, GroupRound, decide_with, quiet_until
from hfai.controller.policy.rules import ordering, service_band
from hfai.controller.policy.views import Decision, JobView, NodeView, PolicyConfig, Resize
from hfai.controller.queues import GroupJobs, JobIndex
from hfai.protocol import reasons
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.speedup import Speedup, fit, idle_cap


def model_of(job: JobView, config: PolicyConfig) -> Speedup:
    """The job's speedup curve, fitted to its measured throughput (the prior without any), flat
    past the smallest size it kept its GPUs mostly idle at (``low_gpu_util``): there, whatever
    the fit says of sizes not yet seen, more nodes will not help."""
    model = fit(job.throughput, config.prior_serial)
    cap = idle_cap(job.gpu_util, config.low_gpu_util)
    return replace(model, cap=cap) if cap else model


def _even(x: float) -> float:
    """A gain rounded so that equal gains worked out by different sums compare equal: ties keep
    the rules' order (a linear curve's every node adds 1.0, and then the order is hfai's)."""
    return round(x, 9)


def restart_cost(job: JobView, config: PolicyConfig) -> float:
    """Seconds a resize of ``job`` costs: its measured restart (JobRecord.restart_s), else the
    configured ``resize_cost_s``; at most a slice."""
    return min(job.restart_s or config.resize_cost_s, config.slice_s)


def pays(model: Speedup, n: int, m: int, config: PolicyConfig, cost_s: float | None = None) -> float:
    """What resizing from ``n`` to ``m`` nodes gains over the coming slice, in one-node-seconds
    of progress, the restart (``cost_s``, default ``resize_cost_s``) included (negative: it
    does not pay)."""
    t = config.slice_s
    c = min(config.resize_cost_s if cost_s is None else cost_s, t)
    if t <= 0:  # no slice, no horizon to weigh the restart against: any gain counts
        return model.relative(m) - model.relative(n)
    return model.relative(m) * (t - c) - model.relative(n) * t


class GainRound(GroupRound):
    """One group's round of the gain policy (see the module doc)."""

    def __init__(self, jobs: GroupJobs, usable_names: list[str], free: list[str], index: JobIndex, group: str,
                 now: float, config: PolicyConfig):
        super().__init__(jobs, usable_names, free, index, group, now, config)
        self.models: dict[str, Speedup] = {}
        self.resized: set[str] = set()

    def model(self, job: JobView) -> Speedup:
        m = self.models.get(job.id)
        if m is None:
            m = self.models[job.id] = model_of(job, self.config)
        return m

    def add_room(self, job: JobView) -> int:
        room = self.room(job)
        return job.hi if room is None else room

    # -- idle nodes to this round's starts

    def widen_starts(self) -> None:
        if self.blocked:
            return
        heap: list[tuple[float, int, int]] = []
        for order, (job, ns) in enumerate(self.starts):
            if len(ns) < job.hi:
                heap.append((-_even(self.model(job).gain(len(ns))), order, 0))
        heapq.heapify(heap)
        while heap and self.n_free() > 0:
            neg, order, _ = heapq.heappop(heap)
            if -neg < self.config.node_gain_min:
                break  # the best next node adds too little: the rest add less still
            job, ns = self.starts[order]
            if self.add_room(job) < 1:
                continue
            ns.extend(self.take_free(1))
            self.used[(job.user, job.priority, self.group)] += 1
            if len(ns) < job.hi:
                heapq.heappush(heap, (-_even(self.model(job).gain(len(ns))), order, 0))

    # -- idle nodes to running jobs

    def ripe(self, job: JobView) -> bool:
        """Elastic, ran a slice at its size: it may be resized now."""
        return (job.hi > job.lo and job.id not in self.resized and job.id not in self.pool.taken
                and self.now - job.started_ts >= self.config.slice_s)

    def best_growth(self, job: JobView, extra: int) -> tuple[float, int]:
        """(throughput each added node adds, nodes to add) of the growth of ``job`` by at most
        ``extra`` nodes that gains most over the coming slice, if it pays for its restart and
        gains ``grow_min_gain``; (0, 0) if none does."""
        n, model = len(job.held), self.model(job)
        # Measured at fewer than two sizes, its curve is the prior's guess: it grows as hfai
        # grows it (into idle nodes, whatever the restart costs), as the module doc promises.
        cost = restart_cost(job, self.config) if len(job.throughput) >= 2 else 0.0
        best, best_paid = (0.0, 0), 0.0
        base = model.relative(n)
        for k in range(1, extra + 1):
            if model.relative(n + k) < base * (1 + self.config.grow_min_gain):
                continue
            paid = pays(model, n, n + k, self.config, cost)
            if paid > best_paid:
                best, best_paid = (_even(model.gain(n, k) / k), k), paid
        return best

    def grow_running(self) -> None:
        candidates = sorted((j for j in self.jobs.running.values() if len(j.held) < j.hi and self.ripe(j)),
                            key=lambda j: (j.started_ts, j.id))
        while candidates and self.n_free() > 0:
            best: tuple[float, int, JobView] | None = None
            for job in candidates:  # oldest first: among equal gains, hfai's order
                extra = min(job.hi - len(job.held), self.n_free(), self.add_room(job))
                per_node, k = self.best_growth(job, extra)
                if k and (best is None or per_node > best[0]):
                    best = (per_node, k, job)
            if best is None:
                break
            _, k, job = best
            candidates.remove(job)
            self.take_free(k)  # set aside for its restart
            self.used[(job.user, job.priority, self.group)] += k
            self.grow(job, len(job.held) + k, for_job="")
        self.rebalance()

    def grow(self, job: JobView, size: int, for_job: str) -> None:
        n = len(job.held)
        model = self.model(job)
        gain = round(100 * (model.relative(size) / model.relative(n) - 1))
        self.resized.add(job.id)
        self.out.append(Resize(job.id, reasons.grows(held=n, size=size, gain=gain, unit=job.throughput_unit),
                               for_job=for_job, size=size))

    # -- nodes moved between running elastic jobs

    def rebalance(self) -> None:
        """Shrink the running elastic job whose surplus nodes add least for the one whose next
        nodes add most, while that pays (see the module doc). One move per round: the next round
        sees the jobs as they then are."""
        t = self.config.slice_s
        takers = [j for j in self.jobs.running.values() if len(j.held) < j.hi and self.ripe(j)]
        givers = [j for j in self.jobs.running.values() if len(j.held) > j.lo and self.ripe(j)]
        if not takers or not givers:
            return
        best: tuple[float, JobView, JobView, int] | None = None
        for r in takers:
            rm, nr = self.model(r), len(r.held)
            rp, rb = self.prio.get(r.id, r.priority), service_band(r, self.now, self.config)
            for d in givers:
                if d.id == r.id or d.user == r.user or self.prio.get(d.id, d.priority) > rp:
                    continue
                if service_band(d, self.now, self.config) < rb:
                    continue
                dm, nd = self.model(d), len(d.held)
                for k in range(1, min(r.hi - nr, nd - d.lo, self.add_room(r)) + 1):
                    if rm.relative(nr + k) < rm.relative(nr) * (1 + self.config.grow_min_gain):
                        continue
                    won = rm.relative(nr + k) * (t - restart_cost(r, self.config)) - rm.relative(nr) * t
                    lost = dm.relative(nd) * t - dm.relative(nd - k) * (t - restart_cost(d, self.config))
                    net = won - lost
                    if net > 0 and (best is None or net > best[0]):
                        best = (net, r, d, k)
        if best is None:
            return
        _, r, d, k = best
        self.pool.take(d)
        self.used[(r.user, r.priority, self.group)] += k
        nd = len(d.held)
        dm = self.model(d)
        lost = round(100 * (1 - dm.relative(nd - k) / dm.relative(nd)))
        why = reasons.time_slice(job=r.id, minutes=(self.now - d.started_ts) / 60, size=nd - k, lost=lost,
                                 unit=d.throughput_unit)
        self.resized.add(d.id)
        self.out.append(Resize(d.id, why, for_job=r.id, sliced=True, size=nd - k))
        self.grow(r, len(r.held) + k, for_job="")

    # -- contended nodes: which eligible victims give first

    def shrink_loss(self, victim: JobView, size: int) -> int:
        """What the nodes a victim shrunk to ``size`` gives up added, by its speedup curve."""
        model, n = self.model(victim), len(victim.held)
        return round(100 * (1 - model.relative(size) / model.relative(n)))

    def candidates(self, job: JobView, p: int) -> Iterator[JobView]:
        """The victims :class:`GroupRound` allows, per priority level in its order, except that
        elastic jobs with surplus nodes come first in each level, those whose surplus adds least
        first (they are shrunk rather than suspended)."""
        level: list[JobView] = []
        level_p: int | None = None
        for v in super().candidates(job, p):
            vp = self.prio.get(v.id, v.priority)
            if vp != level_p:
                yield from self.by_surplus(level)
                level, level_p = [], vp
            level.append(v)
        yield from self.by_surplus(level)

    def by_surplus(self, level: list[JobView]) -> Iterable[JobView]:
        def key(v: JobView) -> tuple[int, float]:
            n = len(v.held)
            if v.hi <= v.lo or n <= v.lo:
                return (1, 0.0)  # not shrinkable: after, in the rules' order (the sort is stable)
            m = self.model(v)
            per_node = (m.relative(n) - m.relative(v.lo)) / (n - v.lo)
            # Only surplus that adds less than an idle node is worth giving (node_gain_min) comes
            # first; the rest keep the rules' order (most service, longest held): shrinking a job
            # that scales well first only trades one restart for another.
            return (0, per_node) if per_node < self.config.node_gain_min else (1, 0.0)
        return sorted(level, key=key)


def decide(jobs: Iterable[JobView] | JobIndex, nodes: Iterable[NodeView], now: float,
           config: PolicyConfig) -> list[Decision]:
    """The gain policy's decisions for this moment (hfai's, with elastic jobs sized by gain)."""
    return decide_with(GainRound, jobs, nodes, now, config)


#: hfai's rules with elastic jobs sized by measured gain (the simulator's "hfai-gain").
HFAI_GAIN: Policy = FunctionPolicy("hfai-gain", decide, ordering, quiet_until)


def live_policy(name: str) -> Policy:
    """The leader's policy named by ``[controller] policy``."""
    policies = {HFAI.name: HFAI, HFAI_GAIN.name: HFAI_GAIN}
    if name not in policies:
        raise InvalidRequest(f"config [controller] policy: {name!r} is none of {', '.join(policies)}")
    return policies[name]
