"""The telemetry history of every node, read from the stream HFAI_TELEMETRY with the web
service's own credential (role ``web``): an ordered consumer from ``telemetry_max_age_s`` ago,
which then goes on delivering live heartbeats. Kept in memory per node, bounded by age and count."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import logging
import time

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.js.api import ConsumerConfig, DeliverPolicy

from hfai.core.config import Config
from hfai.core.daemon import raise_if_cancelled
from hfai.core.retry import Backoff
from hfai.protocol import decode, names
from hfai.protocol.errors import ProtocolError
from hfai.protocol.types import NodeRecord
from hfai.web.series import Sample, sample_of

log = logging.getLogger(__name__)

#: Samples kept per node (one an hour at a 1 s heartbeat, more at slower ones).
MAX_SAMPLES = 3600
#: The longest wait between two looks for the stream (the first: ``[nats] setup_retry_s``).
RETRY_CAP_S = 10.0


class TelemetryHistory:
    def __init__(self, config: Config):
        self.max_age_s = config.web.telemetry_max_age_s
        self._retry_s = config.nats.setup_retry_s
        self.samples: dict[str, collections.deque[Sample]] = {}
        self.ready = asyncio.Event()

    def add(self, record: NodeRecord) -> None:
        q = self.samples.setdefault(record.name, collections.deque(maxlen=MAX_SAMPLES))
        q.append(sample_of(record))
        cutoff = time.time() - self.max_age_s
        while q and q[0].ts < cutoff:
            q.popleft()

    def first_ts(self) -> float | None:
        """When the oldest sample kept was taken (None: none yet)."""
        return min((q[0].ts for q in list(self.samples.values()) if q), default=None)

    def of(self, node: str) -> list[Sample]:
        return list(self.samples.get(node, ()))

    async def follow(self, nc: Client) -> None:
        """Read the history, then live heartbeats, until cancelled (waits for the stream to exist)."""
        js = nc.jetstream()
        backoff = Backoff(self._retry_s, max(self._retry_s, RETRY_CAP_S))
        while True:
            raise_if_cancelled()
            try:
                await js.stream_info(names.TELEMETRY_STREAM)
                break
            except (nats.js.errors.NotFoundError, nats.errors.Error, TimeoutError) as e:
                wait_s = backoff.next()
                log.info("telemetry stream not there yet (%s); retrying in %.1fs", e or type(e).__name__, wait_s)
                await asyncio.sleep(wait_s)
        start = dt.datetime.fromtimestamp(time.time() - self.max_age_s, dt.UTC)
        cfg = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=start)
        sub = await js.subscribe(names.TELEMETRY_WILDCARD, stream=names.TELEMETRY_STREAM, ordered_consumer=True,
                                 config=cfg, cb=self._on_msg)
        self.ready.set()
        try:
            await asyncio.Event().wait()
        finally:
            try:
                await sub.unsubscribe()
            except Exception as e:  # the connection may be gone already: nothing to undo
                log.debug("telemetry subscription not unsubscribed: %s", e)

    async def _on_msg(self, msg) -> None:
        try:
            record = decode(msg.data, NodeRecord)
        except ProtocolError as e:
            log.debug("dropping an unreadable telemetry sample on %s: %s", msg.subject, e)
            return
        if msg.subject == names.telemetry_subject(record.name):  # an agent reports only for itself
            self.add(record)
