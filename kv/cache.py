"""A live copy of a KV bucket, kept by a watch (:class:`KVCache`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from nats.js.kv import KeyValue

from hfai.core import nats as _nats
from hfai.core.clock import SYSTEM, Clock
from hfai.core.daemon import cancel_and_wait
from hfai.protocol import decode
from hfai.protocol.errors import ProtocolError

log = logging.getLogger(__name__)

T = TypeVar("T")

KV_DEL = "DEL"
KV_PURGE = "PURGE"


class KVCache(Generic[T]):
    """key -> (value, revision) for one bucket, updated by a watch; ``seen`` holds the local
    monotonic time (``clock``'s) of each key's last update (used for heartbeats: no clock skew
    between hosts).
    """

    def __init__(self, kv: KeyValue, kind: type[T] | tuple[type, ...], on_change: Callable[[str], None] | None = None,
                 clock: Clock = SYSTEM):
        self._kv = kv
        self._clock = clock
        self._kind = kind
        self._on_change = on_change
        self.values: dict[str, T] = {}
        self.revisions: dict[str, int] = {}
        self.seen: dict[str, float] = {}
        self._watcher: KeyValue.KeyWatcher | None = None  # the current watch
        self._task: asyncio.Task | None = None
        # Of the current watch's initial snapshot, until its end marker: the keys delivered
        # (None once complete) and the highest revision (anything newer was written after it began).
        self._delivered: set[str] | None = None
        self._newest = 0
        self.ready = asyncio.Event()
        # The highest revision this copy has applied (from the watch or our own writes): the
        # watch delivers in stream order, so every write up to it is reflected here.
        self.high = 0
        self._trackers: list[set[str]] = []  # see track()

    def track(self) -> set[str]:
        """A set that every key changed from now on (written, deleted, or put locally) is added
        to, until :meth:`untrack`: a reader that drains it catches up in O(changes), not O(keys)."""
        changed: set[str] = set()
        self._trackers.append(changed)
        return changed

    def untrack(self, changed: set[str]) -> None:
        self._trackers = [t for t in self._trackers if t is not changed]

    def _changed(self, key: str) -> None:
        for t in self._trackers:
            t.add(key)
        if self._on_change is not None:
            self._on_change(key)

    @property
    def task(self) -> asyncio.Task:
        """The task that follows the bucket (once started): it runs until :meth:`stop`."""
        assert self._task is not None, "KVCache.start() first"
        return self._task

    async def start(self) -> None:
        first = await self._open()
        self._task = asyncio.create_task(
            _nats.follow(self._open, self._on_entry, self._kv._name, on_watch=self._on_watch, watcher=first),
            name=f"kvcache-{self._kv._name}")
        await self.ready.wait()

    async def _open(self):
        self._watcher = await self._kv.watchall()
        return self._watcher

    def _on_watch(self) -> None:
        """A watch begins (the first, or a new one after a failure): it first delivers every
        current value, and keys it does not deliver before its end-of-snapshot marker were
        deleted meanwhile: they are dropped."""
        self._delivered, self._newest = set(), 0

    def _on_entry(self, entry) -> None:
        if entry is None:  # the watch has delivered everything that existed at start
            if self._delivered is not None:
                self._drop_missing(self._delivered, self._newest)
                self._delivered = None
            self.ready.set()
            return
        if self._delivered is not None:
            self._delivered.add(entry.key)
            self._newest = max(self._newest, entry.revision or 0)
        self._apply(entry)
        if not self.ready.is_set() and not entry.delta:
            self.ready.set()

    def _drop_missing(self, keys: set[str], newest: int) -> None:
        """Forget keys a fresh snapshot did not hold, unless we wrote them after it began."""
        for key in [k for k in self.values if k not in keys and self.revisions.get(k, 0) <= newest]:
            self.values.pop(key, None)
            self.revisions.pop(key, None)
            self._changed(key)

    def _apply(self, entry) -> None:
        key = entry.key
        self.high = max(self.high, entry.revision or 0)
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
        self.seen[key] = self._clock.monotonic()
        self._changed(key)

    def cached(self, key: str) -> tuple[T, int] | None:
        """The value at ``key`` and its revision as this copy holds them (for :func:`cas_value`)."""
        value, revision = self.values.get(key), self.revisions.get(key)
        return None if value is None or revision is None else (value, revision)

    def put_local(self, key: str, value: T, revision: int) -> None:
        """Record our own successful write right away, ahead of the watch delivering it."""
        if revision >= self.revisions.get(key, 0):
            self.values[key] = value
            self.revisions[key] = revision
            for t in self._trackers:
                t.add(key)

    async def stop(self) -> None:
        if self._task is not None:  # first, so that the watch ending is not taken for a failure
            await cancel_and_wait([self._task])
        if self._watcher is not None:
            try:
                await self._watcher.stop()
            except Exception as e:  # the connection may already be closed on shutdown
                log.debug("stopping the watch of bucket %s: %s", self._kv._name, e)
