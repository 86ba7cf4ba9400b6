"""What the lease holder does: consume agent events, watch node liveness, run the policy, and
write per-node assignments — a thin executor around pure functions.

Every write is a compare-and-set on a job record, and assignments are derived from the records
alone (see assignments.py), so a new leader continues exactly where the old one stopped.

No stale writer wins (docs/architecture.md, "Fencing" and "No stale writer wins"): every assignment write is a
compare-and-set on the revision this term read or wrote, onto a value whose fence is at most this
term's; every decision is a compare-and-set on a record whose ``term`` is at most this term's,
and stamps it with this term. Before its first decision a new leader stamps its term on every
node's assignment and every live record that holds nodes, and the waiting records while it
schedules, so the server refuses any write of an older term, however long that leader was paused
and wherever; an older term's start that lands on a waiting record first is taken back by the
plan if its nodes were given away (see _take_over).

Wait reasons are no writes: the leader notes them on its board (controller/waits.py) and
publishes them to the replicas in batches. The pure plan runs in a thread, so the lease's renewal
runs meanwhile, and a round writes for at most ROUND_SHARE_OF_TTL of the lease's TTL.

The loop reports progress (:meth:`Leader.beat`) at every tick and every record written; the lease
is renewed only while it does, and the controller's watchdog ends a loop that stopped (see
election.py and service.py). Every loop here also tests for a cancellation that an await inside
nats-py swallowed (see hfai.core.daemon), so stopping the leader cannot hang.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from hfai.controller import transitions
from hfai.controller.assignments import desired_assignments, fence_bound, same_work
from hfai.controller.clockcheck import ClockWatch
from hfai.controller.election import LeaseElection
from hfai.controller.faults import ASSIGNMENT_PUT, freeze_point
from hfai.controller.inputs import plan_nodes, plan_settings
from hfai.controller.nodes import NodeTracker
from hfai.controller.plan import Explain, Planner, PlanNode, PlanSettings, StartRun
from hfai.controller.policy.gain import live_policy
from hfai.controller.runclock import RunClock, recount, with_ages
from hfai.controller.throughput import apply_throughput, nodes_utilization
from hfai.controller.waits import WaitBoard, pack_batches
from hfai.core.clock import SYSTEM, Clock
from hfai.core.config import Config
from hfai.core.daemon import bounded, cancel_and_wait, raise_if_cancelled, wait_event
from hfai.core.nats import events_subscription
from hfai.core.retry import Backoff
from hfai.kv import KVCache, cas_update
from hfai.protocol import decode, encode, names
from hfai.protocol.errors import HfaiError, NotFound, ProtocolError
from hfai.protocol.types import ChainState, GpuFaultEvent, JobRecord, NodeAssignment, RunEvent, RunThroughput, evolve

log = logging.getLogger(__name__)

EVENT_BATCH = 256
STAMP_BATCH = 64  # records stamped at once at a takeover
#: A round writes its decisions for at most this share of the lease's time to live, then ends
#: (the next round plans again from the records): the loop beats at least once a round, and a
#: round as long as leader_stall_s would give the lease up.
ROUND_SHARE_OF_TTL = 0.25
ASSIGN_ATTEMPTS = 4  # compare-and-set attempts of one assignment write
EXPLAIN_SHARE = 0.1  # of the leader's time, at most, spent working out why jobs wait (ExplainThrottle)
#: Jittered waits before fetching or subscribing to the events again after NATS refused (every
#: replica's leader loop meets a NATS restart at the same moment).
EVENTS_RETRY_S, EVENTS_RETRY_CAP_S = 0.5, 5.0


@dataclass
class ExplainThrottle:
    """When a round also works out why every waiting job waits (O(queue)): every ``every_s``,
    and sooner when a job began waiting without a reason, but not within ``new_every_s`` of the
    last such round (a steady stream of submissions would make every round explain)."""

    every_s: float
    new_every_s: float
    last: float = -math.inf
    #: The least time between explaining rounds, from how long the last one took (see :meth:`took`).
    gap_s: float = 0.0

    def due(self, now: float, unexplained: bool) -> bool:
        every, new_every = max(self.every_s, self.gap_s), max(self.new_every_s, self.gap_s)
        if now >= self.last + every or (unexplained and now >= self.last + new_every):
            self.last = now
            return True
        return False

    def took(self, seconds: float) -> None:
        """The last explaining plan took ``seconds``: explaining takes at most EXPLAIN_SHARE of
        the leader's time (at 20,000 queued it is a quarter of a second of pure Python, and
        every other round, decisions included, waits for it on a busy host)."""
        self.gap_s = seconds / EXPLAIN_SHARE


class Leader:
    def __init__(self, config: Config, js: JetStreamContext, jobs_kv: KeyValue, assign_kv: KeyValue,
                 jobs: KVCache[JobRecord], nodes: NodeTracker, election: LeaseElection, wake: asyncio.Event,
                 settings: KVCache | None = None, clock: Clock = SYSTEM, board: WaitBoard | None = None,
                 publish: Callable[[str, bytes], Awaitable[None]] | None = None):
        self.config = config
        self._clock = clock
        self.cc = config.controller
        self._js = js
        self._jobs_kv = jobs_kv
        self._assign_kv = assign_kv
        self.jobs = jobs
        self.nodes = nodes
        self.election = election
        self.wake = wake
        self.settings = settings
        self.fence = election.token or 0
        # node -> (the assignment the bucket holds as this term last saw it, its revision; 0: none)
        self._assigned: dict[str, tuple[NodeAssignment | None, int]] = {}
        self._superseded = False  # a later term's write was seen: this loop leads no more
        self._lost_nodes: set[str] = set()
        self._led_since = self._clock.monotonic()  # when this loop began leading
        self._next_gc = 0.0  # monotonic time of the next sweep of finished jobs
        self.planner = Planner(live_policy(self.cc.policy))  # this term's scheduling state (controller/plan.py)
        self._changed: set[str] | None = None  # job keys changed since the planner last caught up
        self._explain = ExplainThrottle(self.cc.explain_interval_s, self.cc.explain_new_interval_s)
        # The replica's (service.py), which saw runs begin before this term; made alone, a leader
        # counts a run from its own first sight of it.
        self.run_clock = RunClock(clock)
        self.clock_watch: ClockWatch | None = None  # the replica's check of its clock (service.py)
        # Why the waiting jobs wait: in memory, published to the replicas (controller/waits.py),
        # never written into the records; every note of an older term is dropped.
        self.board = board if board is not None else WaitBoard(jobs.revisions if jobs is not None else {})
        self.board.notes.clear()
        self.board.term = self.fence
        self._publish = publish
        self._next_full = 0.0  # monotonic time of the next publish of every note
        self._stamping: asyncio.Task | None = None  # the waiting records' stamps (see _take_over)
        self._publisher: asyncio.Task | None = None  # wait reasons on their way (_publish_waits)
        self.last_beat = self._clock.monotonic()

    def beat(self) -> None:
        """The loop made progress (a tick began, a decision or an assignment is being written): the
        lease may be renewed. Only the scheduling loop beats, never the event consumer: a loop
        that consumes events but schedules nothing must not keep the lease."""
        self.last_beat = self._clock.monotonic()
        self.election.beat()

    def leading(self) -> bool:
        """Still the leader of the term this loop began in (a lease lost and won again since is a
        new term, with a new fence: it gets a new loop)."""
        return not self._superseded and self.election.is_leader and self.election.token == self.fence

    async def run(self) -> None:
        """Lead until the lease is lost or the task is cancelled."""
        log.info("leading with fence %d", self.fence)
        events: asyncio.Task | None = None
        try:
            await self._take_over()
            # Give every node a full heartbeat window after a takeover before calling it dead.
            now = self._led_since = self._clock.monotonic()
            for name in self.nodes.cache.values:
                self.nodes.cache.seen[name] = max(self.nodes.cache.seen.get(name, now), now)
            psub = await events_subscription(self._js, self.config)
            events = asyncio.create_task(self._consume_events(psub), name="leader-events")
            while self.leading():
                raise_if_cancelled()
                if events.done():  # never silently lead without consuming events
                    events.result()  # re-raises what stopped it, for the service to log and retry
                    raise RuntimeError("the event consumer stopped")
                if self._stamping is not None and self._stamping.done():
                    self._stamping.result()  # a stamp that could not be written fails the loop
                    self._stamping = None
                self.beat()
                # Clear before the tick: a wake-up that arrives during the tick must start another.
                self.wake.clear()
                await self.tick()
                await wait_event(self.wake, self.cc.schedule_interval_s, self._clock)
        finally:
            if self._changed is not None:
                self.jobs.untrack(self._changed)
            # Bounded: StuckTasksError if the consumer will not stop; the controller then exits.
            tasks = [t for t in (events, self._stamping, self._publisher) if t is not None]
            if tasks:
                await cancel_and_wait(tasks, self.cc.cancel_timeout_s)
        log.info("no longer leading (fence %d)", self.fence)

    async def _take_over(self) -> None:
        """Stamp this term on everything an older leader could still write: before any decision,
        every node's assignment and every live record that is not waiting (once this replica's
        copy holds every write made before the term began); the waiting records in a task of
        their own, while the rounds go on (20,000 queued jobs would hold the first round back
        for many seconds). From then on the server refuses the older term's writes (see the
        module docstring). A waiting record an older leader wrote before its stamp can only
        have been started, on nodes this term may have given to another job meanwhile: the
        plan takes such a claim back (PlanSettings.term). A stamp that cannot be written fails
        the loop, which the service starts again."""
        await self._load_assignments()
        await self._reach_bucket_end()
        await self._stamp_records(waiting=False)
        self._catch_up()
        await self._publish_assignments()
        if self.leading():
            log.info("fence %d stamped on the jobs holding nodes and %d nodes' assignments", self.fence,
                     len(self._assigned))
            self._stamping = asyncio.create_task(self._stamp_records(waiting=True), name="leader-stamps")

    async def _reach_bucket_end(self) -> None:
        """Wait until the jobs copy has applied every write the bucket held when this term began
        (a record submitted a moment ago may still be on its way; an older leader may have seen it)."""
        last = (await self._jobs_kv.status()).stream_info.state.last_seq or 0
        deadline = self._clock.monotonic() + max(1.0, self.cc.lease_ttl_s)
        while self.jobs.high < last:
            if self._clock.monotonic() >= deadline:
                # Only a message gone from the stream (never delivered) keeps it short for so long.
                log.warning("the jobs copy reached revision %d of %d; stamping what it holds", self.jobs.high, last)
                return
            self.beat()
            await self._clock.sleep(0.01)

    async def _stamp_records(self, waiting: bool) -> None:
        """Stamp this term on the live records that wait (``waiting``), or on the others. The
        waiting ones go in queue order (priority, then arrival), the likeliest to start first;
        their stamping is no progress of the scheduling loop, so it does not beat."""
        fence = self.fence

        def stamp(job: JobRecord) -> JobRecord | None:
            return None if job.state.final or job.term >= fence else evolve(job, term=fence)

        live = [j for j in self.jobs.values.values()
                if not j.state.final and j.term < fence and j.state.waiting == waiting]
        if waiting:
            live.sort(key=lambda j: (-j.spec.priority, j.submit_ts, j.id))
        keys = [j.id for j in live]
        for i in range(0, len(keys), STAMP_BATCH):
            if not self.leading():
                return  # the loop ends at once (run checks leading())
            if not waiting:
                self.beat()
            batch = keys[i:i + STAMP_BATCH]
            before = [self.jobs.revisions.get(k, 0) for k in batch]
            written = await asyncio.gather(*(cas_update(self._jobs_kv, k, stamp, cached=self.jobs.cached(k))
                                             for k in batch), return_exceptions=True)
            for key, old_rev, result in zip(batch, before, written, strict=True):
                if isinstance(result, NotFound):
                    continue  # forgotten meanwhile (a finished record's purge)
                if isinstance(result, BaseException):
                    raise result
                record, rev, changed = result
                if changed:
                    self.jobs.put_local(key, record, rev)
                    self.board.restamp(key, old_rev, rev)  # why it waits did not change
                elif record.term > fence:
                    log.warning("job %s was decided on by a later term (%d > %d): this term leads no more",
                                key, record.term, fence)
                    self._superseded = True
                    return

    async def tick(self) -> None:
        await self._plan_round()
        await self._publish_assignments()
        await self._publish_waits()
        if self._clock.monotonic() >= self._next_gc:
            self._next_gc = self._clock.monotonic() + self.cc.gc_interval_s
            await self._forget_finished()

    def _retention_now(self) -> float | None:
        """The time finished jobs' ages are judged at: the NATS server's (controller/clockcheck.py);
        None while this host's clock is unchecked or disagrees with it (nothing is forgotten then);
        this host's own where no check runs (a leader made alone, in tests)."""
        if self.clock_watch is None:
            return self._clock.time()
        now = self.clock_watch.server_now(self._clock.time(), self._clock.monotonic())
        if now is None and self.clock_watch.skewed:
            log.warning("not forgetting finished jobs: this host's clock is %s", self.clock_watch.describe())
        elif now is None:  # a replica just started, or NATS does not answer: the next sweep tells
            log.info("not forgetting finished jobs: this host's clock is not checked against the NATS server's")
        return now

    async def _forget_finished(self) -> None:
        """Delete the records of jobs finished longer ago than the retention (a final record
        never changes again, so a plain purge races with nothing)."""
        now = self._retention_now()
        if now is None:
            return
        for job_id in transitions.expired(self.jobs.values.values(), now, self.cc.finished_retention_s):
            try:
                await self._jobs_kv.purge(job_id)
            except nats.errors.Error as e:
                log.warning("could not forget finished job %s: %s", job_id, e)
                return
            log.info("forgot finished job %s (retention %gs)", job_id, self.cc.finished_retention_s)

    # ------------------------------------------------------------------------------- events

    async def _consume_events(self, psub) -> None:
        """Fetch and apply events until cancelled; owns ``psub`` (unsubscribed on the way out).

        After a NATS server or a JetStream consumer leader changes, a pull subscription can go
        quiet for good: fetches time out while events wait in the stream (seen with a 3-server
        cluster). So the subscription is made anew after a failed fetch, and after quiet fetches
        whenever the consumer reports pending events (checked every ``event_stall_s``)."""
        fetch_s = 1.0
        quiet_since = self._clock.monotonic()
        backoff = Backoff(EVENTS_RETRY_S, EVENTS_RETRY_CAP_S)
        try:
            while True:
                # A fetch or an ack can swallow our cancellation (3.11's wait_for inside nats-py
                # returns a result that is ready as the cancellation arrives): test for it each
                # round, or the leader waits for this task for ever.
                raise_if_cancelled()
                try:
                    # Bounded from outside too: a fetch must never wait forever.
                    msgs = await bounded(psub.fetch(EVENT_BATCH, timeout=fetch_s), fetch_s + 5.0)
                except (TimeoutError, nats.errors.TimeoutError):
                    backoff.reset()  # the server answered: nothing to fetch
                    if self._clock.monotonic() - quiet_since >= self.cc.event_stall_s:
                        quiet_since = self._clock.monotonic()
                        if await _pending(psub):
                            psub = await self._resubscribe(psub, "events are pending but none arrive")
                    continue
                except nats.errors.Error as e:
                    log.warning("event fetch failed: %s", e)
                    await self._clock.sleep(backoff.next())
                    psub = await self._resubscribe(psub, f"fetch failed ({type(e).__name__})")
                    continue
                backoff.reset()
                quiet_since = self._clock.monotonic()
                for m in msgs:
                    await self._handle_event(m)
                self.wake.set()
        finally:
            await _unsubscribe(psub)

    async def _resubscribe(self, psub, why: str):
        log.warning("renewing the event subscription: %s", why)
        await _unsubscribe(psub)
        backoff = Backoff(EVENTS_RETRY_S, EVENTS_RETRY_CAP_S)
        while True:
            raise_if_cancelled()
            try:
                return await events_subscription(self._js, self.config)
            except (TimeoutError, nats.errors.Error) as e:
                wait_s = backoff.next()
                log.warning("event subscription failed (%s); retrying in %.1fs", e, wait_s)
                await self._clock.sleep(wait_s)

    async def _handle_event(self, m) -> None:
        try:
            ev = decode(m.data, (RunEvent, GpuFaultEvent, RunThroughput))
        except ProtocolError as e:
            log.warning("dropping undecodable event on %s: %s", m.subject, e)
            await m.ack()
            return
        if not self.election.is_leader:
            return  # unacked: the next leader gets it again
        node = _subject_node(m.subject)
        if isinstance(ev, GpuFaultEvent):
            await self._handle_fault(m, ev, node)
            return
        if isinstance(ev, RunThroughput):
            await self._handle_throughput(m, ev, node)
            return
        if ev.node != node:
            log.warning("dropping %s event for job %s: %s", ev.event.value, ev.job_id,
                        f"it names node {ev.node!r} but came on {m.subject}")
            await m.ack()
            return
        if transitions.changes_nothing(ev):
            await m.ack()  # STARTED: no record to read (a round trip per run) for a change of nothing
            return
        rejected: list[str] = []

        def change(job: JobRecord) -> JobRecord | None:
            rejected.clear()  # the compare-and-set may run this again on a newer record
            why = transitions.event_rejection(job, ev, node)
            if why is not None:
                rejected.append(why)
                return None
            return transitions.apply_event(job, ev, self._clock.time(), self.config.dev.idle_s)

        try:
            await self._update(ev.job_id, change)
            if rejected:
                log.info("dropping %s event from %s: %s", ev.event.value, node, rejected[0])
        except HfaiError as e:
            log.warning("event %s for %s not applied: %s", ev.event.value, ev.job_id, e)
        except (TimeoutError, nats.errors.Error) as e:
            # JetStream busy (e.g. the jobs bucket changing leader): leave the event unacked, it
            # comes back after event_ack_wait_s; applying it late or twice is harmless.
            log.warning("event %s for %s not applied yet (%s); it will be redelivered",
                        ev.event.value, ev.job_id, e or type(e).__name__)
            return
        await m.ack()

    async def _handle_throughput(self, m, ev: RunThroughput, node: str) -> None:
        """A run's measured throughput (controller/throughput.py), from its rank 0's own agent,
        kept with the GPU utilisation of the job's nodes as their heartbeats say now."""
        if ev.node == node:
            records = self.nodes.cache.values
            try:
                await self._update(ev.job_id,
                                   lambda job: apply_throughput(job, ev, nodes_utilization(records, job.nodes)))
            except HfaiError as e:
                log.info("throughput of %s not kept: %s", ev.job_id, e)
            except (TimeoutError, nats.errors.Error) as e:
                log.info("throughput of %s not kept (%s); the next window says as much", ev.job_id,
                         e or type(e).__name__)
        await m.ack()  # a window lost is no harm: the next one comes within a minute

    async def _handle_fault(self, m, ev: GpuFaultEvent, node: str) -> None:
        """A GPU fault under a run: a line in its job's history. Only the node's own agent may
        report one, and only for a run it holds (as for run events)."""
        if ev.node != node:
            log.warning("dropping a GPU fault event for job %s: it names node %r but came on %s", ev.job_id,
                        ev.node, m.subject)
            await m.ack()
            return
        try:
            await self._update(ev.job_id, lambda job: transitions.apply_gpu_fault(job, ev))
        except HfaiError as e:
            log.warning("GPU fault event for %s not applied: %s", ev.job_id, e)
        except (TimeoutError, nats.errors.Error) as e:
            log.warning("GPU fault event for %s not applied yet (%s); it will be redelivered", ev.job_id,
                        e or type(e).__name__)
            return
        await m.ack()

    # ------------------------------------------------------------------------------ the plan

    async def _plan_round(self) -> None:
        """Run the pure plan (controller/plan.py) on the records and nodes as this replica sees
        them and write its changes, each with compare-and-set. Decisions first, without the wait
        reasons (a millisecond at 20,000 queued); then, when an explaining round is due, the
        plan again with them (O(queue): a quarter of a second there), so nodes freed by an
        un-drain are never kept waiting for 20,000 explanations."""
        self._catch_up()
        nodes = self._node_states()
        lost = {n.name for n in nodes if not n.alive}
        for name in sorted(lost - self._lost_nodes):
            log.warning("node %s is down", name)
        self._lost_nodes = lost
        if not await self._plan_and_write(nodes, explain=False):
            return
        if self._explain.due(self._clock.monotonic(), self.planner.unexplained()):
            self._catch_up()  # this round's own writes
            began = self._clock.monotonic()
            await self._plan_and_write(self._node_states(), explain=True)
            self._explain.took(self._clock.monotonic() - began)

    async def _plan_and_write(self, nodes: list[PlanNode], explain: bool) -> bool:
        """Plan once and write the decisions (notes for the reasons); False if the round must
        end here (no longer leading, or out of time)."""
        # The pure plan is O(queue) of Python: in a thread, so that this replica's lease renewal
        # and API answers run meanwhile. Nothing else touches the planner while it plans.
        actions = await asyncio.to_thread(self.planner.plan, nodes, self._round_settings(explain), self._clock.time())
        decisions = []
        for action in actions:
            if isinstance(action, Explain):
                self._note(action)
            else:
                decisions.append(action)
        # Starts first: they are what a waiting queue waits for; the rest follow in plan order.
        decisions.sort(key=lambda a: not isinstance(a, StartRun))
        ends = self._clock.monotonic() + ROUND_SHARE_OF_TTL * self.cc.lease_ttl_s
        for action in decisions:
            if not self.election.is_leader:
                return False
            if self._clock.monotonic() >= ends:
                # What is left is planned again next round, from the records as they are then.
                log.info("round cut short after %.1fs; the rest of its decisions next round",
                         ROUND_SHARE_OF_TTL * self.cc.lease_ttl_s)
                self.wake.set()
                return False
            self.beat()  # a long round of writes is progress, not a stall
            await self._update(action.job_id, self._fenced(lambda j, a=action: a.apply(j, self._clock.time())))
        return True

    def _note(self, action: Explain) -> None:
        """Why a waiting job waits, on the board (not in its record: no write), if its record is
        still the one the plan worked it out on."""
        job_id = action.job_id
        now, planned = self.jobs.values.get(job_id), self.planner.records.get(job_id)
        # The same record, or an equal copy (the watch delivering our own write again).
        if now is not None and (now is planned or now == planned):
            self.board.note(job_id, self.jobs.revisions.get(job_id, 0), action.why)

    async def _publish_waits(self) -> None:
        """Publish the reasons noted since the last time to the replicas (every one, now and
        then), in a task of its own: packing 20,000 notes takes a while, and the next round must
        not wait for it. While one is on its way, the notes wait for the next."""
        if self._publish is None or not self.leading():
            return
        if self._publisher is not None:
            if not self._publisher.done():
                return
            self._publisher.result()  # what is not a NATS error is a bug: the loop fails, loudly
        full = self._clock.monotonic() >= self._next_full
        if full:
            self._next_full = self._clock.monotonic() + self.cc.wait_reason_interval_s
        notes = self.board.take(full)
        self._publisher = asyncio.create_task(self._send_waits(notes), name="leader-waits") if notes else None

    async def _send_waits(self, notes: list) -> None:
        publish = self._publish
        assert publish is not None, "only with a publisher"
        batches = await asyncio.to_thread(pack_batches, self.fence, notes, self.cc.api_reply_bytes)
        for batch in batches:
            try:
                await publish(names.WAITS_SUBJECT, batch.data)
            except (TimeoutError, nats.errors.Error) as e:
                # Nothing is lost for good: the next full publish carries every reason again.
                log.warning("could not publish wait reasons: %s", e)
                return

    def _catch_up(self) -> None:
        """Bring the planner up to the records: all of them the first time in a term, then only
        the keys that changed (a bucket keeps finished jobs for weeks: O(changes) a round)."""
        if self._changed is None:
            self._changed = self.jobs.track()
            self.planner.sync(self.jobs.values)
            return
        keys = list(self._changed)
        self._changed.clear()
        self.planner.sync_keys(self.jobs.values, keys)

    def _node_states(self) -> list[PlanNode]:
        # Only live jobs hold nodes: the planner's records are those.
        return plan_nodes(self.nodes, self.planner.records.values(), self._clock.monotonic() - self._led_since)

    def _settings(self, explain: bool) -> PlanSettings:
        settings = plan_settings(self.cc, self.settings.values if self.settings is not None else {}, explain)
        return replace(settings, term=self.fence)

    def _round_settings(self, explain: bool) -> PlanSettings:
        """The round's settings, with the runs' ages as this replica measures them (runclock.py)."""
        return with_ages(self._settings(explain), self.run_clock, self.planner.records)

    def _fenced(self, change):
        """``change`` as a decision of this term: a no-op on a record a later term has written
        (its ``term`` is higher: then this loop leads no more) or once this loop no longer leads;
        otherwise the new record carries this term. The term test is what makes a late write
        impossible, whatever the timing: a record a later term stamped is refused here when read
        again, and the compare-and-set refuses the copy from before the stamp (see _take_over).
        The lease test spares a thawed leader work it would only see refused."""
        fence = self.fence

        def fenced(job: JobRecord) -> JobRecord | None:
            if job.term > fence:
                self._superseded = True
                return None
            if not self.leading():
                return None
            new = change(job)
            return new if new is None or new.term == fence else evolve(new, term=fence)

        return fenced

    async def _update(self, job_id: str, change) -> None:
        before: list[ChainState] = []  # the state of the record the write was based on

        def tracked(job: JobRecord) -> JobRecord | None:
            before[:] = [job.state]
            # A requeue adds the run's time to run_s: as this replica measured it, not by wall stamps.
            return recount(job, change(job), self.run_clock)

        try:
            record, rev, changed = await cas_update(self._jobs_kv, job_id, tracked, cached=self.jobs.cached(job_id))
        except HfaiError as e:
            log.warning("could not update job %s: %s", job_id, e)
            return
        if changed:
            self.jobs.put_local(job_id, record, rev)
            # Each state change once. Acks, one rank's exit and wait reasons rewrite the record in
            # the same state; logging every write repeated "-> suspending" up to four times for a
            # two-node job (decision, two acks, first exit).
            if before and record.state is not before[0]:
                log.info("job %s (%s) -> %s: %s", job_id, record.spec.name, record.state.value, record.reason)

    # -------------------------------------------------------------------------- assignments

    async def _load_assignments(self) -> None:
        for key in await _keys(self._assign_kv):
            self._assigned[key] = await self._read_assignment(key)

    async def _read_assignment(self, node: str) -> tuple[NodeAssignment | None, int]:
        """What the bucket holds for ``node`` and its revision (0: no such key)."""
        try:
            entry = await self._assign_kv.get(node)
        except (nats.js.errors.KeyDeletedError, nats.js.errors.KeyNotFoundError) as e:
            # A deleted or purged key still has a revision (its marker's): the next write must name
            # it. nats-py's get raises KeyNotFoundError for it, with the marker as ``entry``.
            return None, (e.entry.revision or 0) if e.entry is not None else 0
        try:
            return decode(entry.value, NodeAssignment), entry.revision or 0
        except ProtocolError as e:
            log.warning("node %s's assignment is unreadable (%s); it will be replaced", node, e)
            return None, entry.revision or 0

    async def _publish_assignments(self) -> None:
        self._catch_up()  # this round's own writes; finished jobs are assigned nothing
        # Keys of nodes this replica does not know (yet) are written too: nothing of an older
        # term may stay there unstamped.
        nodes = list(self.nodes.cache.values) + [n for n in self._assigned if n not in self.nodes.cache.values]
        wanted = desired_assignments(
            list(self.planner.records.values()), nodes, self.fence,
            self.cc.ack_window_s, self.cc.kill_window_s, fence_bound(self.cc.heartbeat_timeout_s),
        )
        for node, assignment in wanted.items():
            if same_work(self._assigned.get(node, (None, 0))[0], assignment):
                continue
            if not self.leading():
                return
            self.beat()
            await self._write_assignment(node, assignment)

    async def _write_assignment(self, node: str, assignment: NodeAssignment) -> None:
        """Compare-and-set ``node``'s assignment on the revision this term last saw, which holds a
        value of this term or an older one. A refused write means someone wrote since: an older
        term (a leader thawed mid-write), whose value ours replaces, or a later one, after which
        this loop writes nothing more."""
        data = encode(assignment)
        rev = self._assigned.get(node, (None, 0))[1]
        for _ in range(ASSIGN_ATTEMPTS):
            freeze_point(ASSIGNMENT_PUT, node)
            try:
                self._assigned[node] = (assignment, await self._assign_kv.update(node, data, last=rev))
                return
            except nats.js.errors.KeyWrongLastSequenceError:
                held, rev = await self._read_assignment(node)
            if held is not None and held.fence > self.fence:
                log.warning("node %s's assignment was written by a later leader (fence %d > %d): "
                            "this term writes no more", node, held.fence, self.fence)
                self._superseded = True
                return
            self._assigned[node] = (held, rev)
            log.warning("node %s's assignment was written by fence %s since this term read it; replacing it",
                        node, held.fence if held is not None else "none")
        log.warning("node %s's assignment keeps changing; trying again next round", node)


def _subject_node(subject: str) -> str:
    """The node token of an events subject (what NATS permissions let only that node's agent
    publish on); "" for anything else."""
    prefix = names.event_subject("")
    return subject[len(prefix):] if subject.startswith(prefix) else ""


async def _pending(psub) -> bool:
    """Whether the consumer holds events we have not received: never delivered, or delivered
    but unacknowledged although nothing reached us (False if it cannot be asked now)."""
    try:
        info = await psub.consumer_info()
        return (info.num_pending or 0) + (info.num_ack_pending or 0) > 0
    except (TimeoutError, nats.errors.Error):
        return False


async def _unsubscribe(psub) -> None:
    try:
        await psub.unsubscribe()
    except Exception as e:  # the connection or the subscription may already be gone: nothing to undo
        log.debug("event subscription not unsubscribed: %s", e)


async def _keys(kv: KeyValue) -> list[str]:
    try:
        return await kv.keys()
    except nats.js.errors.NoKeysError:
        return []
