"""The reconcile loop: carry out the plan (:func:`hfai.agent.plan.plan`, pure) on the node.

Each round takes a snapshot of the run directories, plans from it and the desired runs, and
carries the plan out on the :class:`RunStore`: first what changes the node (start, raise the
suspend flag, signal, clean up), in plan order, each act checked against the snapshot's state
(:func:`hfai.agent.plan.next_state`), then every report at once (:mod:`hfai.agent.reports`).
A round runs every ``[agent] reconcile_interval_s``, and at once when woken: the assignment or an
operation changed, or a launcher exited (a pidfd).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import nats.errors

from hfai.agent.assignment import AssignmentWatch
from hfai.agent.cleanup import Cleanup
from hfai.agent.diskwatch import DiskWatch
from hfai.agent.fence import Fence
from hfai.agent.heartbeat import loop_backoff
from hfai.agent.metrics import AgentMetrics
from hfai.agent.operations import Operations
from hfai.agent.plan import Act, Action, LocalRun, next_state, plan
from hfai.agent.reports import REPORTS, Reports
from hfai.agent.runs import DiskFull, RunStore
from hfai.agent.statefile import LocalStateError
from hfai.agent.trust import StartError
from hfai.core.clock import Clock
from hfai.core.config import AgentConfig
from hfai.core.daemon import FailureStreak, raise_if_cancelled, wait_event
from hfai.protocol.types import RunAssignment, RunEventKind

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, node: str, ac: AgentConfig, store: RunStore, clock: Clock, wake: asyncio.Event, *,
                 assignment: AssignmentWatch, ops: Operations, reports: Reports, fence: Fence, disk: DiskWatch,
                 cleanup: Cleanup, metrics: AgentMetrics | None = None):
        self.node = node
        self.ac = ac
        self.store = store
        self.clock = clock
        self.wake = wake  # set: plan again now
        self.assignment = assignment
        self.ops = ops
        self.reports = reports
        self.fence = fence
        self.disk = disk
        self.cleanup = cleanup
        self.metrics = metrics
        self._pidfds: set[int] = set()

    async def loop(self) -> None:
        streak = FailureStreak(self.ac.reconcile_failures_max)  # failures on this node's own state
        # After a round NATS refused (a failure, or a report not acknowledged) the next comes after
        # a jittered backoff instead of the period: every agent met the same outage at once. A
        # local fault keeps the period: it herds nothing, and the streak's bound counts rounds.
        backoff = loop_backoff(self.ac.reconcile_interval_s, self.ac.heartbeat_interval_s)
        while True:
            raise_if_cancelled()
            self.wake.clear()
            self.reports.unacked = False
            nats_refused = False
            try:
                await self.reconcile()
                streak.succeeded()
                nats_refused = self.reports.unacked
            except LocalStateError:
                raise
            except (nats.errors.Error, TimeoutError):
                nats_refused = True
                log.exception("reconcile failed on NATS; retrying")  # the connection heals itself
            except Exception as e:
                if isinstance(e, OSError) and self.disk.full(e):
                    # A full disk does not count: the node drains itself meanwhile, and works
                    # again once space is back.
                    log.warning("reconcile met a full disk: %s", e)
                else:
                    # A disk that stays read-only (or any local fault) does not heal by retrying:
                    # past the bound the agent stops (systemd restarts it, and meanwhile the leader
                    # moves the work) rather than heartbeating as a healthy node that never runs
                    # anything.
                    log.exception("reconcile failed (%d in a row); retrying", streak.count + 1)
                    if streak.failed():
                        raise LocalStateError(f"reconcile failed {streak.count} times in a row: {e}") from e
            if nats_refused:
                delay = backoff.next()
            else:
                backoff.reset()
                delay = self.ac.reconcile_interval_s
            await wait_event(self.wake, delay, self.clock)

    async def reconcile(self) -> None:
        """Carry out the plan: first what changes the node (start, signal, clean up), in plan
        order, then every report at once. Reports wait for JetStream's acknowledgement; sent one
        after another, a run that started and exited between two plans (STARTED, EXITED) took
        two round trips before the leader could hear of its end."""
        await self.reports.report_not_started()
        local = self.store.snapshot()
        reports: list[Action] = []
        for action in plan(self.ops.wanted(self._wanted(local), local), local, self.clock.boottime(),
                           self.ac.ack_exit_grace_s):
            if action.act in REPORTS:
                reports.append(action)
            else:
                await self.do(action, local)
        # Throughput first: a run's last window (written as it exited) reaches the leader before
        # its exit report, while the job still holds the size it was measured at.
        await self.reports.relay_throughput(local)
        if reports:
            await self.reports.send(reports, local)

    def _wanted(self, local: dict[str, LocalRun]) -> dict[str, RunAssignment]:
        """The desired runs; while they are unknown (just started, or only a refused entry in KV),
        every run on the node as it is: nothing is started or stopped, exits are still reported."""
        desired = self.assignment.desired
        if self.assignment.known:
            not_started = self.reports.not_started
            if not not_started:
                return desired
            return {k: ra for k, ra in desired.items() if k not in not_started}
        return {key: run.assignment for key, run in local.items()}

    async def do(self, a: Action, local: dict[str, LocalRun]) -> None:
        """Carry out one act of the plan made from ``local``."""
        key, ra = a.key, a.run
        if a.act not in REPORTS:
            next_state(local.get(key), a.act)  # IllegalTransition: a step the run's state does not allow
        if a.act is Act.START:
            self.fence.check_bound(ra.fence_s)
            try:
                launched = self.store.start(ra)
                if launched is None:  # it was here before a crash, and is over: report that
                    self.wake.set()
                    return
                self._wake_on_exit(launched.pid)
                log.info("started %s (job %s rank %d)", key, ra.name, ra.rank)
            except DiskFull as e:
                log.warning("not starting %s: %s", key, e)
                self.disk.full(e)
                # Reported ended without starting (an interruption: the leader requeues it).
                self.reports.not_start(ra, f"not started on {self.node}: {e}")
                self.wake.set()
            except StartError as e:
                log.warning("cannot start %s: %s", key, e)
                if await self.reports.publish(ra, RunEventKind.START_FAILED, message=str(e)):
                    self.store.mark_sent(key, RunEventKind.STARTED)
                    self.store.mark_sent(key, RunEventKind.EXITED)
        elif a.act is Act.RAISE_SUSPEND:
            log.info("asking %s to suspend", key)
            self.store.raise_suspend(key)
            if self.metrics is not None:
                self.metrics.suspend_raised(key)
        elif a.act is Act.TERMINATE:
            log.info("terminating %s", key)
            self.store.signal(key, signal.SIGTERM)
        elif a.act is Act.KILL:
            log.warning("killing %s: still alive after the kill window", key)
            self.store.signal(key, signal.SIGKILL)
        elif a.act in REPORTS:
            await self.reports.send([a], local)
        elif a.act is Act.CLEANUP:
            self.store.cleanup(key)
            self.cleanup.trashed()

    def _wake_on_exit(self, pid: int) -> None:
        """Re-plan as soon as a launcher exits instead of at the next periodic tick.

        A pidfd becomes readable when the process exits (Linux >= 5.3); without pidfds the
        periodic reconcile tick notices the exit a little later.
        """
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            return
        loop = asyncio.get_running_loop()

        def exited() -> None:
            loop.remove_reader(fd)
            self._pidfds.discard(fd)
            os.close(fd)
            self.wake.set()

        loop.add_reader(fd, exited)
        self._pidfds.add(fd)

    def close(self) -> None:
        """Stop watching the launchers' exits (after the loop stopped)."""
        loop = asyncio.get_running_loop()
        for fd in list(self._pidfds):
            loop.remove_reader(fd)
            os.close(fd)
        self._pidfds.clear()
