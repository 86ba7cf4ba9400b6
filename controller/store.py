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


#: Pause before watching a bucket again after its watch failed.
RETRY_S = 0.5


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
        """Apply the watch's entries; if the watch fails or ends (a NATS server or stream leader
        lost), watch anew. A new watch first delivers every current value, and keys it does not
        deliver before its end-of-snapshot marker were deleted meanwhile: they are dropped."""
        while True:
            delivered: set[str] | None = set()  # keys of the initial snapshot, until its marker
            newest = 0  # the snapshot's highest revision: anything newer was written after it began
            try:
                async for entry in self._watcher:
                    if entry is None:  # the watch has delivered everything that existed at start
                        if delivered is not None:
                            self._drop_missing(delivered, newest)
                            delivered = None
                        self.ready.set()
                        continue
                    if delivered is not None:
                        delivered.add(entry.key)
                        newest = max(newest, entry.revision or 0)
                    self._apply(entry)
                    if not self.ready.is_set() and not entry.delta:
                        self.ready.set()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("watch of %s failed (%s); watching anew", self._kv._name, e or type(e).__name__)
            else:
                log.warning("watch of %s ended; watching anew", self._kv._name)
            self._watcher = await self._rewatch()

    async def _rewatch(self):
        while True:
            await asyncio.sleep(RETRY_S)
            try:
                return await self._kv.watchall()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("cannot watch %s yet (%s)", self._kv._name, e or type(e).__name__)

    def _drop_missing(self, keys: set[str], newest: int) -> None:
        """Forget keys a fresh snapshot did not hold, unless we wrote them after it began."""
        for key in [k for k in self.values if k not in keys and self.revisions.get(k, 0) <= newest]:
            self.values.pop(key, None)
            self.revisions.pop(key, None)
            if self._on_change is not None:
                self._on_change(key)

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
        if self._task is not None:  # first, so that the watch ending is not taken for a failure
            await cancel_and_wait([self._task])
        if self._watcher is not None:
            try:
                await self._watcher.stop()
            except Exception:  # the connection may already be closed on shutdown
                pass


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
