"""The leader's decision for one round, without I/O: job records, node states, settings and the
time in; record changes out.

The leader is a thin executor of it (controller/leader.py: write each change with compare-and-set,
then publish the assignments derived from the records), and the simulator executes the very same
plan in virtual time (sim/replay.py), so the two cannot drift apart: run time is counted where
transitions.py counts it, groups come from the records, a restricted user is treated alike.

A round, in order:

1. Nodes that are not alive (no heartbeat, or forgotten) lose their runs: :class:`LoseNode`.
   A node that is alive but faulty (a fatal GPU error) has its runs interrupted instead
   (:class:`Interrupt`): its agent still stops them, and the job is requeued once they exited, so
   the restart elsewhere cannot overlap the old run.
2. Jobs of restricted users (KV ``hfai_users`` key ``restricted``: storage over its limit, ...)
   are interrupted through the normal protocol if running (:class:`Interrupt`) and kept out of
   the policy while waiting, saying why (:class:`Explain`).
3. Jobs past their time limit (``--time``) are stopped (:class:`StopRun`). Waiting jobs that may
   not start yet stay out of the policy, saying why: held (``hfai hold``), waiting for the jobs
   they depend on (``--after``), or their job array at its limit (``--array ...%N``); a job whose
   dependency can never be met (it needed one to succeed, and it failed) is stopped.
4. The policy (controller/policy/, or a baseline in the simulator) decides on the records as
   they will be after 1 to 3; its starts get a master address and port (:class:`StartRun`),
   its suspensions become :class:`Interrupt`, and its wait reasons :class:`Explain` when due.

Every action carries the pure change (:meth:`JobAction.apply`, from transitions.py) that the
executor applies to the record it reads: a record that changed since is simply changed again.

:class:`Planner` keeps the policy's :class:`~hfai.controller.queues.JobIndex` between rounds
(fed with the records that changed) and when it last explained each job; it holds no clock and
does no I/O, and a planner fed the same records plans the same actions as a fresh one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from hfai.controller import transitions
from hfai.controller.assignments import pick_master_port
from hfai.controller.policy import (
    HFAI,
    QUIET_MARGIN_S,
    Decision,
    JobView,
    NodeView,
    Policy,
    PolicyConfig,
    Start,
    Suspend,
    Wait,
)
from hfai.controller.queues import JobIndex
from hfai.controller.views import job_view
from hfai.protocol import reasons
from hfai.protocol.reasons import Reason, ReasonCode
from hfai.protocol.types import ChainState, JobRecord, evolve

#: A running job's view is moved to the leader's measure of its run (Planner._rebase) when its
#: ``started_ts`` is off by more than this: policy windows are minutes long, a second is nothing.
REBASE_SLACK_S = 1.0


@dataclass(frozen=True)
class PlanNode:
    """What the plan knows of a node: ``alive`` (heartbeating, or not yet judged), ``schedulable``
    (alive, not drained, no fatal GPU error), and the address jobs rendezvous at."""

    name: str
    group: str = "default"
    alive: bool = True
    schedulable: bool = True
    address: str = ""
    #: Alive, but a GPU reports a fatal error: its runs are interrupted through the protocol (the
    #: agent stops them) rather than dropped, so a restart elsewhere never overlaps them.
    faulty: bool = False
    #: The hardware fault the node's health watch reports ("": none, or only a fatal GPU reading).
    fault: str = ""


@dataclass(frozen=True)
class PlanSettings:
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    restricted: Mapping[str, str] = field(default_factory=dict)  # user -> why
    master_port_base: int = 20000
    master_port_span: int = 12768  # [controller] master_port_span's default (hfai.core.config)
    #: A waiting job's reason is rewritten at most this often, and only when its gist changes.
    wait_reason_interval_s: float = 30.0
    #: A job whose run failed waits this long before its first retry, twice as long before each
    #: further one, at most ``retry_backoff_max_s`` (controller config of the same names).
    retry_backoff_s: float = 30.0
    retry_backoff_max_s: float = 600.0
    #: The interrupt protocol's windows (as in the assignments): a job that has not acknowledged
    #: its interrupt this long after it began is stopped (SIGTERM), killed ``kill_window_s`` later.
    ack_window_s: float = 60.0
    kill_window_s: float = 30.0
    #: Seconds each job holding nodes has run in its current run, as the leader measures them on
    #: its monotonic clock (controller/runclock.py); a job not in it counts ``now - started_ts``
    #: (the simulator, whose one clock is virtual). Time limits are judged on it.
    ran: Mapping[str, float] = field(default_factory=dict)
    #: Seconds since each waiting job's failed run was set to be retried (``retry_ts``), measured
    #: as ``ran`` is; a job not in it counts ``now - retry_ts``. Retry backoffs are judged on it.
    retried: Mapping[str, float] = field(default_factory=dict)
    #: The leader's term (0: none, as in the simulator). A record of an older term that claims a
    #: node a record of this term holds lost it: an older leader started it after this term
    #: began, before this term's stamp reached its record (controller/leader.py _take_over).
    term: int = 0


# ------------------------------------------------------------------------------------ actions


@dataclass(frozen=True)
class JobAction:
    """What the planner does to one job's record (the agent's run actions are agent/plan.py's)."""

    job_id: str

    def apply(self, job: JobRecord, now: float) -> JobRecord | None:  # pragma: no cover - abstract
        raise NotImplementedError


@dataclass(frozen=True)
class LoseNode(JobAction):
    node: str

    def apply(self, job: JobRecord, now: float) -> JobRecord | None:
        return transitions.apply_node_lost(job, self.node, now)


@dataclass(frozen=True)
class Interrupt(JobAction):
    """Suspend (or resize) the running job: checkpoint, release the nodes, back in line; for a
    fault of node ``avoid``, the job's next start avoids it."""

    decision: Suspend
    avoid: str = ""

    def apply(self, job: JobRecord, now: float) -> JobRecord | None:
        after = transitions.apply_suspend(job, self.decision, now)
        return transitions.avoiding(after, self.avoid) if after is not None and self.avoid else after


@dataclass(frozen=True)
class StartRun(JobAction):
    nodes: tuple[str, ...]
    master_addr: str
    master_port: int
    reason: str = ""

    def apply(self, job: JobRecord, now: float) -> JobRecord | None:
        return transitions.apply_start(job, Start(self.job_id, self.nodes, self.reason), now,
                                       self.master_addr, self.master_port)


@dataclass(frozen=True)
class StopRun(JobAction):
    """The platform ends the job: its time limit, or a dependency that can never be met."""

    why: Reason

    @property
    def reason(self) -> str:
        return self.why.text()

    def apply(self, job: JobRecord, now: float) -> JobRecord | None:
        return transitions.apply_platform_stop(job, now, self.why)


@dataclass(frozen=True)
class Explain(JobAction):
    """Why a waiting job waits (no state change, no history line). The leader keeps it in memory
    and publishes it (controller/waits.py), never in the record; the simulator writes it in."""

    why: Reason

    @property
    def reason(self) -> str:
        return self.why.text()

    def apply(self, job: JobRecord, now: float) -> JobRecord | None:
        return transitions.apply_wait_reason(job, self.why)


# ------------------------------------------------------------------------------------ planner


class Planner:
    """Plans rounds for one leader term (or one replay) with ``policy`` (hfai's unless the
    simulator passes a baseline); the policy's ``ordering`` says how to index the waiting jobs."""

    def __init__(self, policy: Policy = HFAI):
        self.policy = policy
        self.records: dict[str, JobRecord] = {}  # the live records (final ones leave)
        self._views: dict[str, JobView] = {}
        self.index: JobIndex | None = None
        self.explained: dict[str, float] = {}  # job id -> when its reason was last written
        # job id -> the record a reason was last given for, and that reason: what the job shows
        # while its record stays that one (the leader keeps reasons out of the records).
        self.told: dict[str, tuple[JobRecord, Reason]] = {}
        self._fresh: set[str] = set()  # jobs that began waiting since the last explaining round
        self._nodes_seen: tuple[Sequence[PlanNode], list[NodeView], dict[str, str], list[PlanNode]] | None = None
        # Only these jobs need looking at for gates and limits each round (O(them), not O(jobs)).
        self._gated: set[str] = set()  # held, depending on others, or in a limited array
        self._timed: set[str] = set()  # hold nodes and have a time limit
        self._array_active: dict[str, set[str]] = {}  # array id -> members holding nodes
        self.ended: dict[str, ChainState] = {}  # final state of jobs seen to end (dependencies)
        self._ports: dict[str, dict[int, int]] = {}  # address -> master port -> runs holding nodes with it
        self._claims: dict[str, set[str]] = {}  # node -> jobs whose records hold it
        self._ended_records: dict[str, JobRecord] = {}  # the final records sync saw (skipped next time)

    # -- feeding it

    def observe(self, record: JobRecord) -> None:
        """A record is new or changed."""
        if record.state.final:
            self.ended[record.id] = record.state
            self.forget(record.id)
            return
        self._track(record)
        before = self._views.get(record.id)
        self._count_port(self.records.get(record.id), -1)
        self._count_port(record, +1)
        self._claim(self.records.get(record.id), False)
        self._claim(record, True)
        self.records[record.id] = record
        view = self._views[record.id] = job_view(record)
        if record.state.waiting and (before is None or not before.state.waiting):
            self._fresh.add(record.id)
        if self.index is not None:
            self.index.put(view)
        if not record.state.waiting:
            self.explained.pop(record.id, None)
        self._retell(record)

    def _retell(self, record: JobRecord) -> None:
        """A reason given for the record before it changed holds on only if nothing it waits for
        changed: the same record again (a copy of our own write, as the watch delivers it), the
        record with that reason written in (the simulator's Explain), or a new term's stamp."""
        told = self.told.get(record.id)
        if told is None or told[0] is record:
            return
        if record.state.waiting and (told[0] == record or record.why == told[1] or (
                told[0].term != record.term and evolve(told[0], term=record.term) == record)):
            self.told[record.id] = (record, told[1])
            return
        del self.told[record.id]
        if record.state.waiting:
            # It shows its record's reason again: say why it waits at the next explaining round.
            self.explained.pop(record.id, None)
            self._fresh.add(record.id)

    def shown(self, job: JobRecord) -> Reason | None:
        """Why ``job`` says it waits now: the reason last given for this very record, else the
        one its record carries."""
        told = self.told.get(job.id)
        return told[1] if told is not None and told[0] is job else job.why

    def unexplained(self) -> bool:
        """Some job began waiting since the last round that explained every wait."""
        return bool(self._fresh)

    def _track(self, r: JobRecord) -> None:
        spec = r.spec
        if r.hold or spec.after or spec.array_limit or r.retry_ts:
            self._gated.add(r.id)
        else:
            self._gated.discard(r.id)
        if spec.time_limit_s > 0 and r.state.holds_nodes:
            self._timed.add(r.id)
        else:
            self._timed.discard(r.id)
        if spec.array_id:
            active = self._array_active.setdefault(spec.array_id, set())
            if r.state.holds_nodes:
                active.add(r.id)
            else:
                active.discard(r.id)

    def forget(self, job_id: str) -> None:
        r = self.records.get(job_id)
        if r is not None and r.spec.array_id in self._array_active:
            self._array_active[r.spec.array_id].discard(job_id)
        self._gated.discard(job_id)
        self._timed.discard(job_id)
        self._fresh.discard(job_id)
        self._count_port(r, -1)
        self._claim(r, False)
        self.records.pop(job_id, None)
        self._views.pop(job_id, None)
        self.explained.pop(job_id, None)
        self.told.pop(job_id, None)
        if self.index is not None:
            self.index.discard(job_id)

    def sync(self, records: Mapping[str, JobRecord]) -> None:
        """Catch up with a whole bucket's records (records are replaced, never mutated, on every
        change, so an identity test finds the changed ones)."""
        mine, ended = self.records, self._ended_records
        for job_id, r in records.items():
            self._take(job_id, r)
        if len(mine) + len(ended) != len(records):
            for job_id in [k for k in mine if k not in records]:  # purged or deleted
                self.forget(job_id)
            for job_id in [k for k in ended if k not in records]:
                del ended[job_id]

    def sync_keys(self, records: Mapping[str, JobRecord], keys: Iterable[str]) -> None:
        """Catch up with the records at ``keys`` only (changed, new, or gone from ``records``):
        what :meth:`sync` does for them, in O(keys)."""
        for job_id in keys:
            r = records.get(job_id)
            if r is None:  # purged or deleted
                self.forget(job_id)
                self._ended_records.pop(job_id, None)
            else:
                self._take(job_id, r)

    def _take(self, job_id: str, r: JobRecord) -> None:
        """One record of the bucket, as sync finds it."""
        if self.records.get(job_id) is r or self._ended_records.get(job_id) is r:
            return  # unchanged (a bucket keeps finished jobs for weeks: most are these)
        if r.state.final:
            self._ended_records[job_id] = r
            self.ended[job_id] = r.state
            if job_id in self.records:
                self.forget(job_id)
        else:
            self.observe(r)

    def _index(self, config: PolicyConfig) -> JobIndex:
        order = self.policy.ordering(config)
        if self.index is None or self.index.signature != order.signature:
            self.index = JobIndex.of(self._views.values(), order)
        return self.index

    # -- one round

    def plan(self, nodes: Sequence[PlanNode], settings: PlanSettings, now: float) -> list[JobAction]:
        """The actions of one round at time ``now`` (see the module docstring), phase by phase in
        the docstring's order. Deterministic for the same records, nodes, settings, time and
        explanation memory."""
        index = self._index(settings.policy)
        self._rebase(index, settings, now)
        views, address, troubled = self._node_views(nodes)
        rnd = _Round(self.records, settings, now)
        self._lose_superseded(rnd)
        self._lose_troubled(rnd, troubled, index)
        self._restrict(rnd)
        self._stop_timed_out(rnd)
        self._hold_gated(rnd)
        decisions = self._decide(rnd, index, views)
        for decision in self._avoid(decisions, views, index.holder):
            if isinstance(decision, Start):
                self._start(rnd, decision, address)
            elif isinstance(decision, Suspend):  # a Resize too: it is interrupted alike
                rnd.actions.append(Interrupt(decision.job_id, decision))
            elif isinstance(decision, Wait):
                self._note_wait(rnd, decision)
        if settings.policy.explain_waits:
            self._fresh.clear()
        return rnd.actions

    def _lose_superseded(self, rnd: _Round) -> None:
        """Step 1, under a term: an older term's record loses the nodes this term's records hold."""
        if not rnd.settings.term:
            return
        for job_id, node in self._superseded_claims(rnd.settings.term):
            lose = LoseNode(job_id, node)
            rnd.take(lose, lose.apply(rnd.current(job_id), rnd.now))

    def _lose_troubled(self, rnd: _Round, troubled: Sequence[PlanNode], index: JobIndex) -> None:
        """Step 1: the job on a node that is down loses it; the job on a faulty node that is alive
        is interrupted, and its next start avoids that node."""
        for n in troubled:
            job_id = index.holder.get(n.name)
            if job_id is None:
                continue
            job = rnd.current(job_id)
            if n.alive:
                d = Suspend(job_id, reasons.gpu_error(node=n.name, fault=n.fault), for_job="")
                interrupt = Interrupt(job_id, d, avoid=n.name)
                rnd.take(interrupt, interrupt.apply(job, rnd.now))
            else:
                rnd.take(LoseNode(job_id, n.name), transitions.apply_node_lost(job, n.name, rnd.now))

    def _restrict(self, rnd: _Round) -> None:
        """Step 2: a restricted user's running jobs are interrupted, their waiting ones kept from
        the policy, saying why."""
        restricted = rnd.settings.restricted
        if not restricted:
            return
        for job_id, job in self.records.items():
            why = restricted.get(job.spec.user)
            if why is None:
                continue
            job = rnd.overlay.get(job_id, job)
            if job.state.waiting:
                rnd.hidden.append(job_id)
                self._explain(rnd.actions, job, reasons.restricted(why=why), rnd.now, rnd.settings)
            else:
                d = Suspend(job_id, reasons.restricted_interrupt(user=job.spec.user, why=why),
                            for_job="")
                rnd.take(Interrupt(job_id, d), transitions.apply_suspend(job, d, rnd.now))

    def _stop_timed_out(self, rnd: _Round) -> None:
        """Step 3: jobs past their time limit (as the leader measures their run) are stopped."""
        now = rnd.now
        for job_id in sorted(self._timed):
            job = rnd.current(job_id)
            this_run = rnd.settings.ran.get(job_id)
            if transitions.time_limit_reached(job, now, this_run):
                ran = transitions.run_time(job, now, this_run)
                out_of_time = reasons.time_limit(ran=_hms(ran), limit=_hms(job.spec.time_limit_s))
                rnd.take(StopRun(job_id, out_of_time), transitions.apply_platform_stop(job, now, out_of_time))

    def _hold_gated(self, rnd: _Round) -> None:
        """Step 3: waiting jobs that may not start yet (held, backing off, waiting on others, or
        beyond their array's limit) are kept from the policy, saying why; a job whose dependency
        can never be met is stopped."""
        arrays: dict[str, list[JobRecord]] = {}  # waiting members that passed the other gates
        for job_id in sorted(self._gated):
            job = rnd.current(job_id)
            if not job.state.waiting or job_id in rnd.hidden:
                continue
            gate = self._gate(job, rnd.settings, rnd.now)
            if gate is None:
                if job.spec.array_limit:
                    arrays.setdefault(job.spec.array_id, []).append(job)
                continue
            stop, gated = gate
            rnd.hidden.append(job_id)  # waits, or is stopped: not for the policy either way
            if stop:
                rnd.actions.append(StopRun(job_id, gated))
            else:
                self._explain(rnd.actions, job, gated, rnd.now, rnd.settings)
        for array_id, members in arrays.items():
            # Only as many as the array may still start, in index order, go to the policy.
            limit = members[0].spec.array_limit
            running = len(self._array_active.get(array_id, ()))
            room = max(0, limit - running)
            members.sort(key=lambda j: (j.spec.array_index, j.id))
            full = reasons.array_limit(array=array_id, limit=limit, running=running, ahead=room)
            for job in members[room:]:
                rnd.hidden.append(job.id)
                self._explain(rnd.actions, job, full, rnd.now, rnd.settings)

    def _decide(self, rnd: _Round, index: JobIndex, views: Sequence[NodeView]) -> Sequence[Decision]:
        """Step 4: the policy's decisions on the records as steps 1 to 3 leave them. The index
        shows the policy those records (and not the hidden jobs) and is put back as it was."""
        settings, now = rnd.settings, rnd.now
        for after in rnd.overlay.values():
            index.put(self._rebased(job_view(after), settings, now))
        for job_id in rnd.hidden:
            index.discard(job_id)
        try:
            return self.policy.decide(index, views, now, settings.policy)
        finally:
            for job_id in (*rnd.overlay, *rnd.hidden):
                index.put(self._views[job_id])

    def _start(self, rnd: _Round, decision: Start, address: Mapping[str, str]) -> None:
        """A start with its master address (its first node's) and a port free there."""
        addr = address.get(decision.nodes[0], "")
        used = rnd.picked.setdefault(addr, set())
        record = self.records[decision.job_id]
        port = pick_master_port(decision.job_id, record.run_id + 1, _InUse(self._ports.get(addr, {}), used),
                                rnd.settings.master_port_base, rnd.settings.master_port_span)
        used.add(port)
        rnd.actions.append(StartRun(decision.job_id, decision.nodes, addr, port, decision.reason))

    def _note_wait(self, rnd: _Round, decision: Wait) -> None:
        """The policy's wait reason, when due; a job counting on nodes being released is told
        which job holds them up if one has not acknowledged its interrupt."""
        job = rnd.overlay.get(decision.job_id) or self.records[decision.job_id]
        waits = decision.why
        if waits.code in _RELEASE_WAITS:
            group = job.spec.group
            if group not in rnd.unacked:
                rnd.unacked[group] = self._unacked(group, rnd.now, rnd.settings)
            waits = rnd.unacked[group] or waits
        self._explain(rnd.actions, job, waits, rnd.now, rnd.settings)

    def quiet_until(self, settings: PlanSettings, now: float) -> float:
        """The earliest time after ``now`` at which a round on the same records and nodes could
        plan otherwise than one at ``now`` (a time limit running out, a retry's backoff, or what
        the policy's ``quiet_until`` says)."""
        index = self._index(settings.policy)
        self._rebase(index, settings, now)
        t = self.policy.quiet_until(index, now, settings.policy)
        for job_id in self._timed:
            job = self.records[job_id]
            if job.state is ChainState.RUNNING:
                ran = settings.ran.get(job_id)
                started = job.started_ts if ran is None else now - ran
                t = min(t, started + job.spec.time_limit_s - job.run_s - QUIET_MARGIN_S)
        for job_id in self._gated:  # a retry's backoff running out
            job = self.records[job_id]
            left = transitions.retry_wait(job, now, settings.retry_backoff_s, settings.retry_backoff_max_s,
                                          settings.retried.get(job_id))
            if left > 0:
                t = min(t, now + left)
        return max(t, now)

    def _rebase(self, index: JobIndex, settings: PlanSettings, now: float) -> None:
        """Each job holding nodes shown to the policy as started ``settings.ran`` seconds before
        ``now``: its time slice, its ``above_normal_s`` and its service band count the run's time
        as the leader measures it, not ``now`` minus a wall stamp another host (or a leader before
        this one) wrote. The records keep their stamps; only the views move, and
        only when off by over REBASE_SLACK_S (an index update each round would cost)."""
        for job_id in sorted(set(index.holder.values())):
            view = self._views.get(job_id)
            if view is None:
                continue
            moved = self._rebased(view, settings, now)
            if moved is not view:
                self._views[job_id] = moved
                index.put(moved)

    @staticmethod
    def _rebased(view: JobView, settings: PlanSettings, now: float) -> JobView:
        ran = settings.ran.get(view.id) if view.state.holds_nodes else None
        if ran is None or abs(view.started_ts - (now - ran)) <= REBASE_SLACK_S:
            return view
        return replace(view, started_ts=now - ran)

    def _avoid(self, decisions: Sequence[Decision], views: Sequence[NodeView],
               holder: Mapping[str, str]) -> list[Decision]:
        """The decisions with each start's avoided nodes (JobRecord.avoid: a fault interrupted the
        job there) swapped for nodes of the same group that are free and picked by no other start
        this round, where there are such; otherwise the start keeps them (the node is healthy
        again: it is schedulable). A node a start gives up is free for the others: the swaps go
        round until none is left to make (each one uses an avoided node less, so they end)."""
        avoided = [d for d in decisions if isinstance(d, Start) and set(d.nodes) & set(self.records[d.job_id].avoid)]
        if not avoided:
            return list(decisions)
        taken = {n for d in decisions if isinstance(d, Start) for n in d.nodes}
        group = {v.name: v.group for v in views}
        spare = [v.name for v in views if v.schedulable and v.name not in holder and v.name not in taken]
        picked = {d.job_id: list(d.nodes) for d in avoided}
        moved = True
        while moved:
            moved = False
            for d in avoided:
                avoid = set(self.records[d.job_id].avoid)
                nodes = picked[d.job_id]
                for i, n in enumerate(nodes):
                    if n not in avoid:
                        continue
                    other = next((s for s in spare if group[s] == group[n] and s not in avoid), None)
                    if other is not None:
                        spare.remove(other)
                        spare.append(n)
                        nodes[i] = other
                        moved = True
        swapped = {d.job_id: Start(d.job_id, tuple(picked[d.job_id]), d.reason) for d in avoided}
        return [swapped.get(d.job_id, d) if isinstance(d, Start) else d for d in decisions]

    def _unacked(self, group: str, now: float, settings: PlanSettings) -> Reason | None:
        """The wait reason of a job counting on nodes being released in ``group`` while a job
        there has not acknowledged its interrupt (it may ignore the suspend flag): which one, and
        when the platform stops it. The longest-interrupted such job is named; None: none."""
        late: tuple[float, str] | None = None
        for r in self.records.values():
            if r.state is not ChainState.SUSPENDING or r.spec.group != group or len(r.acked) >= len(r.nodes):
                continue
            since = r.history[-1].ts if r.history and r.history[-1].state is r.state else r.started_ts
            if late is None or (since, r.id) < late:
                late = (since, r.id)
        if late is None:
            return None
        since, job_id = late
        stop_at, kill_at = since + settings.ack_window_s, since + settings.ack_window_s + settings.kill_window_s
        return reasons.unacked(job=job_id, since=since, stop_at=stop_at, kill_at=kill_at, late=now >= stop_at)

    def _gate(self, job: JobRecord, settings: PlanSettings, now: float) -> tuple[bool, Reason] | None:
        """Why a waiting job may not start yet: (False, reason) to wait, (True, reason) to stop it
        for good; None: it may."""
        if job.hold:
            return False, transitions.held_reason(job)
        left = transitions.retry_wait(job, now, settings.retry_backoff_s, settings.retry_backoff_max_s,
                                      settings.retried.get(job.id))
        if left > 0:
            return False, reasons.retry_backoff(retried=job.retried, retries=job.spec.retries,
                                                seconds=max(1, round(left)))
        for entry in job.spec.after:
            dep, _, kind = entry.partition(":")
            if dep in self.records:
                return False, reasons.after(job=dep, until="succeed" if kind != "any" else "end")
            ended = self.ended.get(dep)
            # A dependency we never saw end is long gone (purged after its retention): met.
            if ended is not None and kind != "any" and ended is not ChainState.SUCCEEDED:
                return True, reasons.dependency_failed(job=dep, state=ended.value)
        return None

    def _explain(self, actions: list[JobAction], job: JobRecord, why: Reason, now: float,
                 settings: PlanSettings) -> None:
        shown = self.shown(job)
        if shown == why or not _reason_due(job.state.waiting, shown, why, self.explained.get(job.id), now,
                                           settings.wait_reason_interval_s):
            return
        self.explained[job.id] = now
        self.told[job.id] = (job, why)
        actions.append(Explain(job.id, why))

    def _node_views(self, nodes: Sequence[PlanNode]) -> tuple[list[NodeView], dict[str, str], list[PlanNode]]:
        """The policy's node views, the nodes' addresses and the nodes that are down or faulty
        (the simulator passes the same list every round: worked out once)."""
        if self._nodes_seen is not None and self._nodes_seen[0] is nodes:
            return self._nodes_seen[1:]
        views = [NodeView(n.name, n.group, n.schedulable and n.alive) for n in nodes]
        address = {n.name: n.address for n in nodes}
        troubled = [n for n in nodes if not n.alive or n.faulty]
        self._nodes_seen = (nodes, views, address, troubled)
        return views, address, troubled

    def _claim(self, r: JobRecord | None, holds: bool) -> None:
        if r is None or not r.state.holds_nodes:
            return
        for n in r.nodes:
            claims = self._claims.setdefault(n, set())
            if holds:
                claims.add(r.id)
            else:
                claims.discard(r.id)
                if not claims:
                    del self._claims[n]

    def _superseded_claims(self, term: int) -> list[tuple[str, str]]:
        """(job, node) for each claim of an older term's record on a node that a record of
        ``term`` holds too (an older leader's start that landed after this term's began)."""
        out = []
        for node, holders in self._claims.items():
            if len(holders) < 2 or not any(self.records[j].term >= term for j in holders):
                continue
            out += [(j, node) for j in sorted(holders) if self.records[j].term < term]
        return out

    def _count_port(self, r: JobRecord | None, delta: int) -> None:
        """Keep the master ports of the runs that hold nodes, per address, as records change."""
        if r is None or not r.master_port or not r.state.holds_nodes:
            return
        ports = self._ports.setdefault(r.master_addr, {})
        n = ports.get(r.master_port, 0) + delta
        if n > 0:
            ports[r.master_port] = n
        else:
            ports.pop(r.master_port, None)


class _Round:
    """One round's working state: the actions so far, the records as those actions leave them
    (``overlay``, what the policy sees), the waiting jobs kept from the policy, and what the
    decisions' phase has given out (master ports per address) or looked up (unacked groups)."""

    __slots__ = ("actions", "hidden", "now", "overlay", "picked", "records", "settings", "unacked")

    def __init__(self, records: Mapping[str, JobRecord], settings: PlanSettings, now: float):
        self.records, self.settings, self.now = records, settings, now
        self.actions: list[JobAction] = []
        self.overlay: dict[str, JobRecord] = {}
        self.hidden: list[str] = []
        self.picked: dict[str, set[int]] = {}  # master ports given this round, per address
        self.unacked: dict[str, Reason | None] = {}  # group -> who holds up its released nodes

    def current(self, job_id: str) -> JobRecord:
        """The job's record as this round's actions so far leave it."""
        return self.overlay.get(job_id, self.records[job_id])

    def take(self, action: JobAction, after: JobRecord | None) -> None:
        """Keep ``action`` if it changes the record (``after``: what it makes of it)."""
        if after is not None:
            self.actions.append(action)
            self.overlay[action.job_id] = after


class _InUse:
    """The master ports in use at one address: those of runs holding nodes, and this round's."""

    __slots__ = ("held", "picked")

    def __init__(self, held: Mapping[int, int], picked: set[int]):
        self.held, self.picked = held, picked

    def __contains__(self, port: object) -> bool:
        return port in self.held or port in self.picked


#: The policy's reasons for a job that counts on nodes other jobs are releasing.
_RELEASE_WAITS = frozenset({ReasonCode.RELEASING, ReasonCode.PREEMPTING})


def _reason_due(waiting: bool, shown: Reason | None, why: Reason, last: float | None, now: float,
                interval_s: float) -> bool:
    """:func:`transitions.wait_reason_due` for a job that shows ``shown`` (the reason last given
    for its record, which the leader keeps out of the record): a new gist, at most once per
    ``interval_s``."""
    if not waiting or (shown is not None and why.gist() == shown.gist()):
        return False
    return last is None or now - last >= interval_s


def _hms(seconds: float) -> str:
    s = int(max(0.0, seconds))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def plan_once(records: Iterable[JobRecord], nodes: Sequence[PlanNode], settings: PlanSettings, now: float,
              policy: Policy = HFAI) -> list[JobAction]:
    """One round from scratch: what a fresh leader would do with these records."""
    planner = Planner(policy)
    for r in records:
        planner.observe(r)
    return planner.plan(nodes, settings, now)
