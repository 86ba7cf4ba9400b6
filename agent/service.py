"""The node agent: the composition root that wires its collaborators and owns their tasks.

Each job is its own module: the heartbeat and the node record it sends (agent/heartbeat.py), the
term fence and its bound (agent/fence.py), this node's assignment watched and checked
(agent/assignment.py), the plan carried out on the run store (agent/reconcile.py, the plan itself
pure in agent/plan.py), the events sent to the leader and acknowledged (agent/reports.py), the
log clean-up and the trash (agent/cleanup.py), slices of logs served (agent/logread.py), the
state directory's room (agent/diskwatch.py), the GPUs' health (agent/health_watch.py).

Tasks (all owned, all cancelled on close): heartbeat, assignment watch, reconcile loop, log
clean-up, trash, the exec sessions' watch and the health watch; requests for logs, operator
operations, exec and development sessions are served by subscriptions. The tasks are supervised:
one that ends before close (a fault of our own, such as a state file it cannot write:
:class:`hfai.agent.statefile.LocalStateError`) fails the agent, which then exits non-zero for
systemd to restart it, rather than heartbeat on while doing nothing.

One discipline for the loops: each reads the time and sleeps through the agent's :class:`Clock`
(a FakeClock in timing tests), tests ``Task.cancelling()`` every round (``raise_if_cancelled``:
nats-py can swallow a cancellation), waits for its wake-up event or its period with
:func:`hfai.core.daemon.wait_event` (never 3.11's ``asyncio.wait_for``), and retries what NATS refused after a
jittered backoff (``hfai.core.retry``), so a thousand agents do not retry in the same instant after a
NATS restart. The one time not read from the clock is the liveness stamp of the launchers: other
processes compare it with the host's CLOCK_MONOTONIC (see :mod:`hfai.agent.heartbeat`).
"""

from __future__ import annotations

import asyncio
import logging
import os

import psutil
from nats.aio.client import Client

from hfai._atomic import write_atomic
from hfai._metrics import MetricsServer
from hfai.agent.assignment import AssignmentWatch
from hfai.agent.cleanup import Cleanup
from hfai.agent.contain import make_containment
from hfai.agent.devsession import DevSessions
from hfai.agent.diskwatch import DiskWatch
from hfai.agent.exec import ExecService
from hfai.agent.fence import Fence
from hfai.agent.gpu import open_gpu_source
from hfai.agent.health_allreduce import AllreduceSettings
from hfai.agent.health_watch import HealthWatch
from hfai.agent.heartbeat import Heartbeat, default_address
from hfai.agent.identity import check_run_as
from hfai.agent.launchers import make_launcher
from hfai.agent.logread import LogReader
from hfai.agent.metrics import AgentMetrics
from hfai.agent.operations import Operations
from hfai.agent.plan import RunPhase
from hfai.agent.reconcile import Reconciler
from hfai.agent.reports import Reports
from hfai.agent.runs import RunStore
from hfai.agent.watchdog import WatchdogSettings
from hfai.core import nats as _nats
from hfai.core.clock import SYSTEM, Clock
from hfai.core.config import Config
from hfai.core.daemon import Supervisor
from hfai.protocol import names
from hfai.protocol.types import LogChunk, LogRequest, RunAssignment

log = logging.getLogger(__name__)


class Agent:
    def __init__(self, config: Config, clock: Clock = SYSTEM):
        self.config = config
        self.ac = config.agent
        self.clock = clock
        self.node = names.check_token("node name", self.ac.resolved_node())
        self.address = self.ac.address or default_address()
        self.store = RunStore(self.ac.state_dir, self.node, self.ac.env_root, check_run_as(self.ac.run_as),
                              fence_poll_s=self.ac.fence_poll_s, datasets_dir=config.storage.dataset_root,
                              launcher=make_launcher(self.ac.launcher, self.ac.launcher_reply_timeout_s),
                              log_cap_bytes=self.ac.log_cap_bytes, clock=clock,
                              watchdog=WatchdogSettings(self.ac.watchdog_s, self.ac.watchdog_poll_s,
                                                        self.ac.watchdog_dump_s),
                              containment=make_containment(self.ac, self.node, config.storage.workspace_root,
                                                           config.storage.dataset_root, config.dev.notebooks_root,
                                                           psutil.virtual_memory().total, nats_url=config.nats.url,
                                                           creds_dir=config.nats.creds_dir,
                                                           dev_idle_s=config.dev.idle_s),
                              notebooks_root=config.dev.notebooks_root)
        beat_now = asyncio.Event()  # a heartbeat at once: the node's drain reason changed
        self.disk = DiskWatch(self.store.root, self.ac.state_min_free_bytes, drain_now=beat_now.set)
        self.gpus = open_gpu_source(self.ac.gpu_source, self.ac.sim_gpus)
        self.health = HealthWatch(self.node, self.gpus, self.ac.health_interval_s, self.ac.health_check_step_s, clock,
                                  changed=beat_now.set, runs=self._alive_runs,
                                  publish=lambda ev: self.reports.publish_fault(ev),
                                  idle_check_s=self.ac.health_check_idle_s,
                                  allreduce=AllreduceSettings(self.ac.health_allreduce,
                                                              self.ac.health_allreduce_floor_gbps,
                                                              self.ac.health_allreduce_bytes))
        self.metrics = (AgentMetrics(lambda: self._nc.stats["reconnects"] if self._nc else 0,
                                     xids=lambda: self.health.health.xids)
                        if self.ac.metrics_port else None)
        self.reports = Reports(self.node, self.store, self.disk, self.health, clock, config.nats.request_timeout_s,
                               self.ac.throughput_relay_s, self.metrics)
        wake = asyncio.Event()  # plan again now
        self.fence = Fence(self.store.root / "fence", self.disk, self.ac.heartbeat_interval_s)
        self.heartbeat = Heartbeat(self.node, self.address, self.ac, self.store, self.gpus, self.health, self.disk,
                                   self.fence, clock, now=beat_now, metrics=self.metrics)
        self.assignment = AssignmentWatch(self.node, self.fence, changed=wake.set,
                                          accepted=self.reports.forget_heard)
        self.ops = Operations(self.node, self.store, wake.set, self.ac.reconcile_interval_s, self.clock)
        self.execs = ExecService(self.node, self.store, idle_s=self.ac.exec_idle_s, drain_s=self.ac.exec_drain_s,
                                 chunk_bytes=self.ac.exec_chunk_bytes, window=self.ac.exec_window,
                                 poll_s=self.ac.exec_poll_s, clock=clock)
        self.dev = DevSessions(self.node, self.store)
        self.cleanup = Cleanup(self.store, clock, self.ac.log_retention_s, self.ac.log_gc_interval_s)
        self.logs = LogReader(self.node, self.store)
        self.reconciler = Reconciler(self.node, self.ac, self.store, clock, wake, assignment=self.assignment,
                                     ops=self.ops, reports=self.reports, fence=self.fence, disk=self.disk,
                                     cleanup=self.cleanup, metrics=self.metrics)
        self._supervisor = Supervisor()
        self._nc: Client | None = None
        self._closed = False
        self._metrics_server: MetricsServer | None = None

    async def start(self) -> None:
        self.store.launcher.warm()  # its imports run in its own process while this one connects
        self._nc = nc = await _nats.connect(self.config, name=f"hfai-agent-{self.node}")
        self._js = nc.jetstream()
        self._nodes_kv, self._assign_kv = await _nats.agent_buckets(self._js, self.config)
        self.reports.connect(self._js)
        self.heartbeat.connect(nc, self._nodes_kv)
        await self.logs.serve(nc)
        await self.ops.serve(nc)
        await self.execs.serve(nc)
        await self.dev.serve(nc)
        await self.health.serve(nc)
        await self._start_metrics()
        if self.ac.health_check_on_start:
            await self.health.validate()  # a node that fails it starts drained
        await self.heartbeat.first(self.config.nats.setup_retry_s)
        spawn = self._supervisor.spawn
        spawn(self.heartbeat.loop(), "heartbeat")
        spawn(self.assignment.watch(self._assign_kv), "assignment-watch")
        spawn(self.reconciler.loop(), "reconcile")
        spawn(self.cleanup.log_loop(), "log-gc")
        spawn(self.cleanup.trash_loop(), "trash")
        spawn(self.execs.watch(), "exec-watch")
        spawn(self.health.loop(), "health")
        adopted = [k for k, r in self.store.snapshot().items() if r.phase is RunPhase.ALIVE]
        log.info("agent %s up (gpus: %s, address %s)%s", self.node, self.gpus.name, self.address,
                 f"; adopted running runs {adopted}" if adopted else "")

    async def _start_metrics(self) -> None:
        if self.metrics is None:  # [agent] metrics_port is not set
            return
        self._metrics_server = MetricsServer(self.metrics.registry, self.ac.metrics_host, self.ac.metrics_port)
        port = await self._metrics_server.start()
        write_atomic(os.path.join(self.ac.state_dir, "metrics_port"), f"{port}\n".encode())

    async def failed(self) -> str:
        """Returns (with the reason) when a task of the agent ended: the daemon then exits non-zero."""
        return await self._supervisor.failed()

    async def close(self) -> None:
        """Stop all tasks and disconnect. Running jobs keep running: they are not the agent's
        to kill on a restart; the next agent adopts them. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await self._supervisor.stop()
        # The cgroups of runs forgotten since the trash last ran: nothing else would remove them.
        await asyncio.to_thread(self.store.empty_trash)
        await self.execs.close()  # while the connection can still tell their callers
        self.reconciler.close()
        if self._nc is not None:
            try:
                await self._nc.drain()
            except Exception as e:
                log.warning("closing the NATS connection did not drain it (%s): messages not yet flushed "
                            "are lost (unacknowledged events are sent again by the next agent)", e or type(e).__name__)
        self.gpus.close()
        if self._metrics_server is not None:
            await self._metrics_server.close()

    # ---------------------------------------------------------------------------- reconcile

    async def reconcile(self) -> None:
        """One round of the plan carried out (see :class:`hfai.agent.reconcile.Reconciler`)."""
        await self.reconciler.reconcile()

    def collect_old_logs(self, now: float | None = None) -> list[str]:
        """Delete the logs of jobs gone long enough (see :class:`hfai.agent.cleanup.Cleanup`)."""
        return self.cleanup.collect_old_logs(now)

    def _alive_runs(self) -> list[RunAssignment]:
        return [r.assignment for r in self.store.snapshot().values() if r.phase is RunPhase.ALIVE]

    # --------------------------------------------------------------------------------- logs

    def read_log(self, req: LogRequest) -> LogChunk:
        """A slice of one rank's log (see :class:`hfai.agent.logread.LogReader`)."""
        return self.logs.read(req)
