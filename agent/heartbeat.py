"""The node's heartbeat: the :class:`NodeRecord` it puts into ``hfai_nodes`` each interval (and at
once when the node's drain reason changed), also published on ``hfai.telemetry.<node>``.

Each heartbeat NATS accepted also stamps the agent alive for its launchers (RunStore.mark_alive),
which fence their runs themselves when the stamp grows older than the leader's fence bound
(launcher.py). That stamp is the one time not read from the agent's :class:`Clock`: other
processes compare it with the host's CLOCK_MONOTONIC.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time

import nats.errors
import psutil
from nats.aio.client import Client
from nats.js.kv import KeyValue

from hfai._version import __version__
from hfai.agent.diskwatch import DiskWatch
from hfai.agent.fence import Fence
from hfai.agent.gpu import GpuSource
from hfai.agent.health_watch import HealthWatch
from hfai.agent.metrics import AgentMetrics
from hfai.agent.plan import RunPhase
from hfai.agent.runs import RunStore
from hfai.agent.statefile import LocalStateError
from hfai.agent.watchdog import read_watch
from hfai.core.clock import Clock
from hfai.core.config import AgentConfig
from hfai.core.daemon import raise_if_cancelled, wait_event
from hfai.core.retry import Backoff
from hfai.protocol import encode, names
from hfai.protocol.types import HostStat, NodeRecord

log = logging.getLogger(__name__)


def loop_backoff(base_s: float, heartbeat_interval_s: float) -> Backoff:
    """The retry schedule of a loop whose period is ``base_s``: from there up to one heartbeat
    interval (a node never waits longer than a heartbeat to try again)."""
    return Backoff(base_s, max(base_s, heartbeat_interval_s))


class Heartbeat:
    def __init__(self, node: str, address: str, ac: AgentConfig, store: RunStore, gpus: GpuSource,
                 health: HealthWatch, disk: DiskWatch, fence: Fence, clock: Clock, now: asyncio.Event,
                 metrics: AgentMetrics | None = None):
        self.node = node
        self.address = address
        self.ac = ac
        self.store = store
        self.gpus = gpus
        self.health = health
        self.disk = disk
        self.fence = fence
        self.clock = clock
        self.now = now  # set: a heartbeat at once (the node's drain reason changed)
        self.metrics = metrics
        self._seq = 0
        self._nc: Client | None = None
        self._nodes_kv: KeyValue | None = None

    def connect(self, nc: Client, nodes_kv: KeyValue) -> None:
        self._nc, self._nodes_kv = nc, nodes_kv

    async def first(self, setup_retry_s: float) -> None:
        """The first heartbeat, retried while JetStream cannot take it yet: on a fresh replicated
        cluster the bucket exists a moment before its stream answers (no responders)."""
        backoff = loop_backoff(setup_retry_s, self.ac.heartbeat_interval_s)
        while True:
            raise_if_cancelled()
            try:
                await self.once()
                return
            except (nats.errors.Error, TimeoutError) as e:
                delay = backoff.next()
                log.warning("first heartbeat not taken yet (%s); retrying in %.2fs", e or type(e).__name__, delay)
                await self.clock.sleep(delay)

    async def loop(self) -> None:
        while True:
            raise_if_cancelled()
            await wait_event(self.now, self.ac.heartbeat_interval_s, self.clock)
            self.now.clear()
            try:
                await self.once()
            except LocalStateError:
                raise
            except Exception as e:  # NATS away: keep trying, the controller will notice
                log.warning("heartbeat failed: %s", e)

    def record(self) -> NodeRecord:
        """The node as it is now."""
        self._seq += 1
        alive = [k for k, r in self.store.snapshot().items() if r.phase is RunPhase.ALIVE]
        ts, mono = self.clock.time(), time.monotonic()  # the launchers' watchdogs run on the host's own clock
        watches = (read_watch(self.store.runs_dir / k, k, mono, ts) for k in alive)
        health = self.health.health
        return NodeRecord(
            name=self.node, group=self.ac.group, address=self.address, ts=ts, seq=self._seq,
            gpus=self.gpus.sample(busy=bool(alive)), host=_host_stat(), envs=self.store.environments(),
            gpu_source=self.gpus.name, runs=tuple(alive), agent_version=__version__,
            drain_reason=self.health.drain_reason() or self.disk.check(),
            fault=health.fault, faults=tuple(health.faults), check=health.check,
            containment=self.store.containment.summary if self.store.containment is not None else "",
            watchdogs=tuple(w for w in watches if w is not None),
        )

    async def once(self) -> None:
        assert self._nc is not None and self._nodes_kv is not None, "connect() first"
        record = self.record()
        self.fence.retry()
        data = encode(record)
        if self.metrics is not None:
            self.metrics.heartbeat(record)
        # Taken before the put: the leader times the node from when it sees the record, which is
        # after the put reached NATS, so the launchers' fence clock never runs behind the leader's.
        # The host's own clock, not self.clock: the launchers read it against CLOCK_MONOTONIC.
        sent_at = time.monotonic()
        await self._nodes_kv.put(self.node, data)
        # Only a heartbeat NATS accepted keeps this node's runs alive (launcher.py self-fencing).
        # One that cannot be stamped would look alive to the leader while the launchers fence
        # every run: the agent stops instead (the leader then moves the work elsewhere). Unless
        # the disk is full: the stamp is then overwritten in place (RunStore.mark_alive), and if
        # even that fails the node is drained (its runs fence themselves, an interruption).
        try:
            self.store.mark_alive(sent_at)
        except OSError as e:
            if not self.disk.full(e):
                raise LocalStateError(f"cannot stamp this agent alive for its launchers: {e}") from e
            log.warning("cannot stamp this agent alive for its launchers: %s", e)
        await self._nc.publish(names.telemetry_subject(self.node), data)


def _host_stat() -> HostStat:
    vm = psutil.virtual_memory()
    return HostStat(cpu_percent=psutil.cpu_percent(interval=None), memory_used=int(vm.used),
                    memory_total=int(vm.total), load1=psutil.getloadavg()[0])


def default_address() -> str:
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"
