"""One controller replica: serves the API, campaigns for the lease, leads while it holds it."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from hfai import _nats
from hfai._daemon import cancel_and_wait
from hfai.config import Config
from hfai.controller.api import ApiService
from hfai.controller.election import LeaseElection
from hfai.controller.leader import Leader
from hfai.controller.nodes import NodeTracker
from hfai.controller.store import KVCache
from hfai.protocol import names
from hfai.protocol.types import DrainedNodes, JobRecord, NodeRecord, QuotaTable

log = logging.getLogger(__name__)


class Controller:
    def __init__(self, config: Config):
        self.config = config
        self.id = config.controller.id or f"{socket.gethostname()}-{os.getpid()}"
        self.wake = asyncio.Event()
        self._nc = None
        self._sub = None
        self._tasks: list[asyncio.Task] = []
        self._caches: list[KVCache] = []
        self.election: LeaseElection | None = None
        self._closed = False

    async def start(self) -> None:
        self._nc = await _nats.connect(self.config, name=f"hfai-controller-{self.id}")
        js = self._nc.jetstream()
        buckets = await _nats.ensure_shared_state(js, self.config)
        self.jobs = KVCache(buckets.jobs, JobRecord, on_change=lambda _k: self.wake.set())
        self.node_cache = KVCache(buckets.nodes, NodeRecord, on_change=lambda _k: None)
        # Quota or drain changes take effect at once: they wake the scheduler.
        self.settings = KVCache(buckets.users, (QuotaTable, DrainedNodes), on_change=lambda _k: self.wake.set())
        self._caches = [self.jobs, self.node_cache, self.settings]
        for c in self._caches:
            await c.start()
        self.nodes = NodeTracker(self.node_cache, self.config.controller.heartbeat_timeout_s, self.settings)
        self.api = ApiService(buckets.jobs, self.jobs, self.nodes, on_submit=self.wake.set,
                              settings_kv=buckets.users, settings=self.settings, config=self.config.controller)
        self._sub = await self._nc.subscribe(names.API_WILDCARD, queue=names.API_QUEUE, cb=self.api.handle)
        cc = self.config.controller
        self.election = LeaseElection(buckets.leader, self.id, cc.lease_ttl_s, cc.lease_poll_s)
        self.election.start()
        self._tasks.append(asyncio.create_task(self._lead_when_elected(js, buckets), name="leadership"))
        log.info("controller %s serving the API on %s", self.id, self.config.nats.url)

    async def _lead_when_elected(self, js, buckets) -> None:
        while True:
            await self.election.elected.wait()
            leader = Leader(self.config, js, buckets.jobs, buckets.assign, self.jobs, self.nodes,
                            self.election, self.wake, self.settings)
            try:
                await leader.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("leader loop failed; retrying")
                await asyncio.sleep(1.0)

    async def close(self) -> None:
        """Stop leading, release the lease, stop serving. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(self._tasks)
        if self.election is not None:
            await self.election.close()
        if self._sub is not None:
            await self._sub.unsubscribe()
        for c in self._caches:
            await c.stop()
        if self._nc is not None:
            await self._nc.drain()
