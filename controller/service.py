"""One controller replica: serves the API, campaigns for the lease, leads while it holds it.

A watchdog checks that a leader loop, once begun, keeps showing progress: one stuck for
``leader_exit_s`` (or whose tasks ignore their cancellation) makes the replica stop with a
non-zero status, for systemd to restart it, rather than sit on the lease doing nothing. So does
any of its long-lived tasks (leadership, watchdog, lease, the KV caches' watches) ending on its own.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket

from nats.aio.client import Client
from nats.aio.subscription import Subscription

from hfai._metrics import MetricsServer
from hfai.controller.api import ApiService
from hfai.controller.clockcheck import ClockCheck, ClockMetrics
from hfai.controller.election import LeaseElection
from hfai.controller.leader import Leader
from hfai.controller.nodes import NodeTracker
from hfai.controller.runclock import RunClock
from hfai.controller.store_health import StoreProbe
from hfai.controller.waits import WaitBoard
from hfai.core import nats as _nats
from hfai.core.clock import SYSTEM, Clock
from hfai.core.config import Config
from hfai.core.daemon import StuckTasksError, Supervisor, raise_if_cancelled
from hfai.core.retry import Backoff
from hfai.kv import KVCache
from hfai.protocol import names
from hfai.protocol.types import DrainedNodes, JobRecord, NodeRecord, QuotaTable, RestrictedUsers

log = logging.getLogger(__name__)


def _probe_key(controller_id: str) -> str:
    """A KV key for this replica's probe value: its id with anything but [A-Za-z0-9_-] as "_"."""
    return "controller-" + re.sub(r"[^A-Za-z0-9_-]", "_", controller_id)[:50]


def leader_stuck(last_beat: float, now: float, exit_s: float) -> bool:
    """Pure: has a leader loop that last showed progress at ``last_beat`` been stuck too long?"""
    return now - last_beat > exit_s


class Controller:
    def __init__(self, config: Config, clock: Clock = SYSTEM):
        self.config = config
        self.clock = clock  # the leader's, the caches', the node tracker's and the watchdog's
        self.id = config.controller.id or f"{socket.gethostname()}-{os.getpid()}"
        self.wake = asyncio.Event()
        self._nc: Client | None = None
        self._sub: Subscription | None = None
        self._waits_sub: Subscription | None = None
        self.waits: WaitBoard | None = None  # made by start()
        self._supervisor = Supervisor()
        self.run_clock: RunClock | None = None  # made by start(), as is clock_check
        self.clock_check: ClockCheck | None = None
        self._caches: list[KVCache] = []
        self.election: LeaseElection | None = None
        self.leader: Leader | None = None  # the loop leading now, if any
        self.shutdown_timeout_s = config.controller.shutdown_timeout_s
        self._closed = False
        self.metrics_server: MetricsServer | None = None  # when [controller] metrics_port is set

    async def start(self) -> None:
        self._nc = nc = await _nats.connect(self.config, name=f"hfai-controller-{self.id}")
        js = nc.jetstream()
        buckets = await _nats.ensure_shared_state(js, self.config)
        # When each run began, on this replica's monotonic clock (controller/runclock.py): the
        # records of the bucket's first snapshot were written before it watched.
        self.run_clock = RunClock(live=lambda: self.jobs.ready.is_set(), offset=self._clock_offset)
        self.jobs = KVCache(buckets.jobs, JobRecord, on_change=self._job_changed, clock=self.clock)
        self.node_cache = KVCache(buckets.nodes, NodeRecord, on_change=lambda _k: None, clock=self.clock)
        # Quota or drain changes take effect at once: they wake the scheduler.
        self.settings: KVCache[QuotaTable | DrainedNodes | RestrictedUsers] = KVCache(
            buckets.users, (QuotaTable, DrainedNodes, RestrictedUsers), on_change=lambda _k: self.wake.set())
        self._caches = [self.jobs, self.node_cache, self.settings]
        for c in self._caches:
            await c.start()
            self._supervisor.watch(c.task)
        self.nodes = NodeTracker(self.node_cache, self.config.controller.heartbeat_timeout_s, self.settings, self.clock)
        # Why the waiting jobs wait: the leader's notes, in memory on every replica (controller/waits.py).
        self.waits = waits = WaitBoard(self.jobs.revisions)
        self.api = ApiService(buckets.jobs, self.jobs, self.nodes, on_submit=self.wake.set,
                              settings_kv=buckets.users, settings=self.settings, config=self.config.controller,
                              request=self._relay, dev=self.config.dev, waits=waits)
        self._waits_sub = await nc.subscribe(names.WAITS_SUBJECT, cb=self._on_waits)
        cc = self.config.controller
        # Probes as this replica (the key is a KV token: no dots in an id made of a host name).
        self.store_probe = StoreProbe(js, _probe_key(self.id), self.config.nats.replicas, cc.store_probe_s,
                                      cc.store_probe_timeout_s, cc.store_probe_failures)
        self.api.store_health = lambda: self.store_probe.health
        self._supervisor.spawn(self.store_probe.run(), "store-probe")
        self.clock_check = ClockCheck(js, _probe_key(self.id) + "-clock", self.config.nats.replicas, cc.clock_check_s,
                                      cc.store_probe_timeout_s, cc.clock_skew_alarm_s)
        self._supervisor.spawn(self.clock_check.run(), "clock-check")
        await self._start_extras(js)
        self._sub = await nc.subscribe(names.API_WILDCARD, queue=names.API_QUEUE, cb=self.api.handle)
        self.election = LeaseElection(buckets.leader, self.id, cc.lease_ttl_s, cc.lease_poll_s, cc.leader_stall_s)
        self._supervisor.watch(self.election.start())
        self._supervisor.spawn(self._lead_when_elected(js, buckets), "leadership")
        self._supervisor.spawn(self._watchdog(), "leader-watchdog")
        log.info("controller %s serving the API on %s", self.id, self.config.nats.url)

    async def _start_extras(self, js) -> None:
        """Telemetry history, usage accounting and metrics (docs/web.md)."""
        from hfai.controller.history import ensure_telemetry_stream
        from hfai.controller.usage_recorder import UsageRecorder, usage_bucket

        # Started together with a NATS cluster, JetStream may not place R3 streams yet ("no suitable
        # peers"): the controller waits for it, as for its buckets, rather than dying.
        await _nats.retry_setup(lambda: ensure_telemetry_stream(js, self.config), self.config, "the telemetry stream")
        bucket = await _nats.retry_setup(lambda: usage_bucket(js, self.config), self.config, "the usage bucket")
        self.usage = UsageRecorder(bucket, self.jobs, self.config)
        await self.usage.start()
        self._caches.append(self.usage.entries)
        self._supervisor.watch(self.usage.entries.task)
        self._supervisor.spawn(self.usage.run(), "usage-recorder")
        self.api.usage = self.usage.reply
        if self.config.controller.metrics_port:
            from hfai.controller.metrics import ControllerMetrics

            self.metrics = ControllerMetrics(lambda: list(self.jobs.values.values()),
                                             lambda: self.nodes.infos(list(self.jobs.values.values())),
                                             lambda: self._nc.stats["reconnects"] if self._nc else 0,
                                             store=lambda: self.store_probe.health)
            if self.clock_check is not None:
                self.metrics.registry.register(ClockMetrics(self.clock_check.watch))
            cc = self.config.controller
            self.metrics_server = server = MetricsServer(self.metrics.registry, cc.metrics_host, cc.metrics_port)
            await server.start()
            if self.config.controller.metrics_port_file:
                from hfai._atomic import write_atomic

                write_atomic(self.config.controller.metrics_port_file, f"{server.port}\n")
            self._supervisor.spawn(self.metrics.run(lambda: self.leader is not None), "metrics")

    def _job_changed(self, key: str) -> None:
        if self.run_clock is not None:
            self.run_clock.observe(key, self.jobs.values.get(key))
        self.wake.set()

    def _clock_offset(self) -> float | None:
        return self.clock_check.watch.offset(self.clock.monotonic()) if self.clock_check is not None else None

    def _share_clocks(self, leader: Leader) -> None:
        """Give a term's leader the replica's run clock and clock check, which outlive terms."""
        if self.run_clock is not None:
            leader.run_clock = self.run_clock
        if self.clock_check is not None:
            leader.clock_watch = self.clock_check.watch

    async def _relay(self, subject: str, data: bytes, timeout_s: float) -> bytes:
        """Request/reply on the controller's own connection (log requests relayed to agents)."""
        assert self._nc is not None, "start() first"
        return (await self._nc.request(subject, data, timeout=timeout_s)).data

    async def _publish(self, subject: str, data: bytes) -> None:
        assert self._nc is not None, "start() first"
        await self._nc.publish(subject, data)

    async def _on_waits(self, msg) -> None:
        leader = self.leader
        if leader is not None and leader.leading():
            return  # our own notes, already on the board
        if self.waits is not None:
            self.waits.receive(msg.data)

    async def failed(self) -> str:
        """Returns (with the reason) when this replica must stop: the daemon then exits non-zero."""
        return await self._supervisor.failed()

    def _fail(self, reason: str) -> None:
        self._supervisor.fail(reason)

    async def _lead_when_elected(self, js, buckets) -> None:
        election = self.election
        assert election is not None, "start() first"
        backoff = Backoff(1.0, max(1.0, self.config.controller.lease_ttl_s))
        while True:
            raise_if_cancelled()
            await election.elected.wait()
            self.leader = Leader(self.config, js, buckets.jobs, buckets.assign, self.jobs, self.nodes,
                                 election, self.wake, self.settings, self.clock, self.waits, self._publish)
            self._share_clocks(self.leader)
            if self.metrics_server is not None:
                self.metrics.time_rounds(self.leader)
            try:
                await self.leader.run()
                backoff.reset()
            except asyncio.CancelledError:
                raise
            except StuckTasksError as e:
                self._fail(f"the leader loop could not stop its tasks ({e})")
                return
            except Exception:
                wait_s = backoff.next()
                log.exception("leader loop failed; retrying in %.1fs", wait_s)
                await self.clock.sleep(wait_s)
            finally:
                self.leader = None

    async def _watchdog(self) -> None:
        """Stop the replica when the leader loop made no progress for ``leader_exit_s``: by then
        the election has released the lease (after ``leader_stall_s``), but a loop that cannot
        even end would keep this replica from ever leading again."""
        cc = self.config.controller
        while True:
            await self.clock.sleep(min(1.0, cc.leader_exit_s / 4))
            leader = self.leader
            if leader is not None and leader_stuck(leader.last_beat, self.clock.monotonic(), cc.leader_exit_s):
                log.critical("the leader loop (fence %d) made no progress for %.0fs", leader.fence,
                             self.clock.monotonic() - leader.last_beat)
                self._fail(f"the leader loop made no progress for over {cc.leader_exit_s:g}s")
                return

    async def close(self) -> None:
        """Stop leading, release the lease, stop serving. Safe to call twice. Raises
        StuckTasksError if a task ignores its cancellation (the daemon then exits at once)."""
        if self._closed:
            return
        self._closed = True
        bound = self.config.controller.cancel_timeout_s
        try:
            await self._supervisor.stop(bound)
        finally:
            if self.election is not None:  # release the lease even if a task is stuck
                await self.election.close(bound)
        for sub in (self._sub, self._waits_sub):
            if sub is not None:
                await sub.unsubscribe()
        for c in self._caches:
            await c.stop()
        if self.metrics_server is not None:
            await self.metrics_server.close()
        if self._nc is not None:
            await self._nc.drain()
