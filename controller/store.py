"""Live copies of KV buckets (kept by a watch) and compare-and-set writes of job records."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Generic, TypeVar

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from hfai._daemon import cancel_and_wait
from hfai.protocol import decode, encode
from hfai.protocol.errors import Conflict, NotFound, ProtocolError
from hfai.protocol.types import JobRecord

log = logging.getLogger(__name__)

T = TypeVar("T")

KV_DEL = "DEL"
KV_PURGE = "PURGE"


class KVCache(Generic[T]):
    """key -> (value, revision) for one bucket, updated by a watch; ``seen`` holds the local
    monotonic time of each key's last update (used for heartbeats: no clock skew between hosts).
    """

    def __init__(self, kv: KeyValue, kind: type[T] | tuple[type, ...], on_change: Callable[[str], None] | None = None):
        self._kv = kv
        self._kind = kind
        self._on_change = on_change
        self.values: dict[str, T] = {}
        self.revisions: dict[str, int] = {}
        self.seen: dict[str, float] = {}
        self._watcher = None
        self._task: asyncio.Task | None = None
        self.ready = asyncio.Event()

    async def start(self) -> None:
        self._watcher = await self._kv.watchall()
        self._task = asyncio.create_task(self._consume(), name=f"kvcache-{self._kv._name}")
        await self.ready.wait()

    async def _consume(self) -> None:
        async for entry in self._watcher:
            if entry is None:  # the watch has delivered everything that existed at start
                self.ready.set()
                continue
            self._apply(entry)
            if not self.ready.is_set() and not entry.delta:
                self.ready.set()

    def _apply(self, entry) -> None:
        key = entry.key
        if entry.operation in (KV_DEL, KV_PURGE) or entry.value is None:
            self.values.pop(key, None)
            self.revisions.pop(key, None)
        else:
            if entry.revision < self.revisions.get(key, 0):
                return  # we already hold a newer value (written by us)
            try:
                self.values[key] = decode(entry.value, self._kind)
            except ProtocolError as e:
                log.warning("ignoring undecodable value at key %s: %s", key, e)
                return
            self.revisions[key] = entry.revision
        self.seen[key] = time.monotonic()
        if self._on_change is not None:
            self._on_change(key)

    def put_local(self, key: str, value: T, revision: int) -> None:
        """Record our own successful write right away, ahead of the watch delivering it."""
        if revision >= self.revisions.get(key, 0):
            self.values[key] = value
            self.revisions[key] = revision

    async def stop(self) -> None:
        if self._watcher is not None:
            try:
                await self._watcher.stop()
            except Exception:  # the connection may already be closed on shutdown
                pass
        if self._task is not None:
            await cancel_and_wait([self._task])


async def cas_update(kv: KeyValue, key: str, change: Callable[[JobRecord], JobRecord | None],
                     attempts: int = 8) -> tuple[JobRecord, int, bool]:
    """Read-modify-write one job record with compare-and-set, retrying lost races.

    Returns (record, revision, changed). ``change`` must be pure: it may run several times.
    """
    for _ in range(attempts):
        try:
            entry = await kv.get(key)
        except nats.js.errors.KeyNotFoundError:
            raise NotFound(f"no job {key}") from None
        record = decode(entry.value, JobRecord)
        new = change(record)
        if new is None:
            return record, entry.revision, False
        try:
            rev = await kv.update(key, encode(new), last=entry.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            continue
        return new, rev, True
    raise Conflict(f"job {key} is changing too fast; try again")
