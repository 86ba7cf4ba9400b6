"""What the agent tells the leader about its runs, and when it counts as told.

Run events (started, suspend acknowledged, exited, start failed) go to the durable stream with a
``Nats-Msg-Id``, so a retried publish is never counted twice; a run's event is marked sent (a
``.sent`` receipt in its run directory) only after JetStream acknowledged it, and an
unacknowledged one is sent again at a later round (:attr:`Reports.unacked` asks the reconcile loop
for a backoff first). GPU faults under a run go the same way. Throughput windows are relayed
without acknowledgement: a lost one is said again by the next.

Also kept here: the runs this agent reported ended without starting them (its state directory
was full), so they are not started while the assignment still names them.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from nats.js import JetStreamContext

from hfai.agent.diskwatch import DiskWatch
from hfai.agent.health_watch import HealthWatch
from hfai.agent.metrics import AgentMetrics
from hfai.agent.plan import Act, Action, LocalRun, RunPhase, RunUsage, next_state, platform_stopped
from hfai.agent.runs import RunStore
from hfai.agent.throughput import Relay, read_window
from hfai.agent.watchdog import span
from hfai.core.clock import Clock
from hfai.protocol import encode, names
from hfai.protocol.types import GpuFaultEvent, RunAssignment, RunEvent, RunEventKind, RunThroughput

log = logging.getLogger(__name__)

LAUNCHER_DIED = "its launcher died before the job ended"

# The actions that publish an event (see Executor.reconcile).
REPORTS = frozenset({Act.REPORT_STARTED, Act.REPORT_ACK, Act.REPORT_EXIT, Act.REPORT_NEVER_RAN})

# The reason an EXITED event gives for a run its launcher stopped (self-fencing, launcher.py).
FENCED_MESSAGE = "stopped on its node: the node's agent had no heartbeat accepted for the fence bound"


@dataclass
class _NotStarted:
    """A run the agent could not start (its state directory was full) and reports ended."""

    run: RunAssignment
    message: str
    reported: bool = False


class Reports:
    def __init__(self, node: str, store: RunStore, disk: DiskWatch, health: HealthWatch, clock: Clock,
                 timeout_s: float, throughput_relay_s: float, metrics: AgentMetrics | None = None):
        self.node = node
        self.store = store
        self.disk = disk
        self.health = health
        self.clock = clock
        self.timeout_s = timeout_s
        self.metrics = metrics
        self._js: JetStreamContext | None = None
        self.unacked = False  # a report of this reconcile round was not acknowledged
        # Runs this agent reported ended without a run directory (its state directory was full):
        # never started here, whatever the assignment still says (key -> the run and its report).
        self.not_started: dict[str, _NotStarted] = {}
        self._throughput = Relay(throughput_relay_s)  # runs' measured rates to the leader

    def connect(self, js: JetStreamContext) -> None:
        self._js = js

    # ------------------------------------------------------------------------ not started

    def not_start(self, ra: RunAssignment, message: str) -> None:
        """Report ``ra`` ended without starting (an interruption: the leader requeues it)."""
        self.not_started[ra.key] = _NotStarted(ra, message)

    def forget_heard(self, desired: dict[str, RunAssignment]) -> None:
        """The assignment changed: forget the runs reported not started that it no longer names."""
        for key in [k for k, ns in self.not_started.items() if ns.reported and k not in desired]:
            del self.not_started[key]  # the leader heard, and no longer asks for it

    async def report_not_started(self) -> None:
        for key, ns in self.not_started.items():
            if not ns.reported:
                ns.reported = await self.publish(ns.run, RunEventKind.EXITED, exit_code=-1, platform_stopped=True,
                                                 message=ns.message)
                if ns.reported:
                    log.info("reported %s ended without starting: %s", key, ns.message)

    # ---------------------------------------------------------------------------- reports

    async def send(self, actions: list[Action], local: dict[str, LocalRun]) -> None:
        """Publish the events of ``actions`` together (JetStream keeps their order: one
        connection), and mark each sent once acknowledged."""
        for a in actions:
            next_state(local.get(a.key), a.act)  # IllegalTransition: a report the run's state does not allow
        events = [(a, *self.event(a, local)) for a in actions]
        sent = await asyncio.gather(*(self.publish(a.run, kind, **fields) for a, kind, fields in events))
        for (a, kind, _), ok in zip(events, sent, strict=True):
            if ok:
                self.store.mark_sent(a.key, kind)
                if kind is RunEventKind.SUSPEND_ACKED and self.metrics is not None:
                    self.metrics.suspend_acked(a.key)

    def event(self, a: Action, local: dict[str, LocalRun]) -> tuple[RunEventKind, dict]:
        """The event a report action sends, and its fields."""
        key, ra = a.key, a.run
        if a.act is Act.REPORT_STARTED:
            return RunEventKind.STARTED, {}
        if a.act is Act.REPORT_ACK:
            return RunEventKind.SUSPEND_ACKED, {"acked": True}
        if a.act is Act.REPORT_EXIT:
            run = local.get(key)  # the snapshot the plan was made from: it saw the exit
            stopped, message = platform_stopped(run), FENCED_MESSAGE if run is not None and run.fenced else ""
            if run is not None and run.lost and self.disk.last_full is not None:
                # Its launcher ended without recording the status, on a node whose disk was full:
                # the platform lost the run, the user did not fail it.
                stopped, message = True, f"its end could not be recorded: {self.store.full_reason()}"
            elif run is not None and run.lost:
                # Its launcher died (killed) before the job's end: the platform's fault. In a
                # container the job died with it; a bare one's processes are killed through its
                # cgroup here, before the report frees the node for another job.
                stopped, message = True, LAUNCHER_DIED
                left = self.store.end_leftovers(key)
                if left:
                    log.warning("killed %d process(es) of %s, whose launcher died", left, key)
            fault = self.health.health.fault
            if fault is not None and not stopped and (run is None or run.exit_code != 0):
                # A run that failed on a node with a hardware fault failed because of it (a lost
                # GPU ends the job's processes): a platform fault, requeued, never the user's.
                stopped, message = True, f"GPU fault: {fault.text()}"
            used = run.usage if run is not None and run.usage is not None else RunUsage()
            hung_s = run.hung_s if run is not None else 0.0
            if hung_s and not message:
                message = f"hung: no output for {span(hung_s)}; stacks in the log"
            return RunEventKind.EXITED, dict(
                exit_code=run.exit_code if run else -1, acked=bool(run and run.acked),
                platform_stopped=stopped, whole_life_state=self.store.whole_life_state(key), message=message,
                peak_bytes=used.peak_bytes, cpu_s=used.cpu_s,
                oom_limit_bytes=used.limit_bytes if used.oom_kills else 0, hung_s=hung_s)
        assert a.act is Act.REPORT_NEVER_RAN, a
        message = "stopped before it started on this node"
        try:
            self.store.record_never_ran(ra)
            self.store.mark_sent(key, RunEventKind.STARTED)
        except OSError as e:
            if not self.disk.full(e):
                raise
            self.not_started[key] = _NotStarted(ra, message)  # kept from a new start; reported again
        return RunEventKind.EXITED, dict(exit_code=-1, platform_stopped=True, message=message)

    async def publish(self, ra: RunAssignment, kind: RunEventKind, **fields) -> bool:
        """Publish one run event; True once JetStream acknowledged it."""
        ev = RunEvent(event=kind, node=self.node, job_id=ra.job_id, run_id=ra.run_id, ts=self.clock.time(), **fields)
        try:
            await self._stream().publish(
                names.event_subject(self.node), encode(ev),
                headers={"Nats-Msg-Id": f"{self.node}:{ra.key}:{kind.value}"},
                timeout=self.timeout_s,
            )
            return True
        except Exception as e:  # not acknowledged: the next reconcile round tries again, after a backoff
            log.warning("could not report %s of %s: %s", kind.value, ra.key, e)
            self.unacked = True
            return False

    async def publish_fault(self, ev: GpuFaultEvent) -> bool:
        """Report a GPU fault under a run (the leader records it in the job's history)."""
        try:
            await self._stream().publish(
                names.event_subject(self.node), encode(ev),
                headers={"Nats-Msg-Id": f"{self.node}:{ev.job_id}.{ev.run_id}:fault:{ev.fault.ts!r}:{ev.fault.why.code}"
                                        f":{ev.fault.why.params.get('gpu')}:{ev.fault.why.params.get('xid', '')}"},
                timeout=self.timeout_s,
            )
            return True
        except Exception as e:  # not acknowledged: the health watch tries again at its next poll
            log.warning("could not report a GPU fault under %s.%d: %s", ev.job_id, ev.run_id, e)
            return False

    # ------------------------------------------------------------------------- throughput

    async def relay_throughput(self, local: dict[str, LocalRun]) -> None:
        """Relay the throughput windows of this node's rank-0 runs that are due (agent/throughput.py):
        an alive run's at most once an interval, an exited run's last one before its exit is reported."""
        live = {k: r for k, r in local.items() if RunEventKind.EXITED not in r.sent}
        self._throughput.forget(set(live))
        now = self.clock.boottime()
        for key, run in live.items():
            final = run.phase is RunPhase.EXITED
            if not self._throughput.wants(run.assignment, now, final):
                continue
            w = self._throughput.due(run.assignment, read_window(self.store.control_dir(key)), now, final)
            if w is not None:
                ra = run.assignment
                ev = RunThroughput(node=self.node, job_id=ra.job_id, run_id=ra.run_id, ts=self.clock.time(),
                                   rate=w.rate, seconds=w.seconds, unit=w.unit, startup_s=w.startup_s)
                await self._publish_throughput(ev)

    async def _publish_throughput(self, ev: RunThroughput) -> None:
        try:  # not acknowledged: lost, the next window says as much
            await self._stream().publish(names.event_subject(self.node), encode(ev), timeout=self.timeout_s)
        except Exception as e:
            log.warning("could not relay the throughput of %s.%d: %s", ev.job_id, ev.run_id, e)

    def _stream(self) -> JetStreamContext:
        assert self._js is not None, "connect() first"
        return self._js
