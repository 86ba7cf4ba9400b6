"""Chunks of pushes in progress, staged in a JetStream object store until a commit writes them.

Each put request becomes one object (a *pack*) named ``<user>/<id>`` whose description lists its
chunks (``hash:length,...``), so the index of what is staged is rebuilt from the bucket's listing
after a restart: a push interrupted midway, or a service restarted, loses nothing already sent.
Only the storage service reads or writes this bucket; users reach it through the service.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ObjectMeta, ObjectMetaOptions, ObjectStoreConfig
from nats.js.object_store import ObjectStore

from hfai.protocol import names
from hfai.protocol.storage import ChunkData

log = logging.getLogger(__name__)

# One pack is stored as one message (a put request is bounded well under NATS's max_payload).
_PACK_MESSAGE_BYTES = 1000 * 1024
_CACHED_PACKS = 8


@dataclass(frozen=True)
class Located:
    pack: str
    offset: int
    length: int


def describe(chunks: list[tuple[str, int]]) -> str:
    return ",".join(f"{h}:{n}" for h, n in chunks)


def parse_description(text: str | None) -> list[tuple[str, int]]:
    """The chunks a pack's description lists (pure); garbage gives none."""
    out = []
    for item in (text or "").split(","):
        h, _, n = item.partition(":")
        if h and n.isdigit():
            out.append((h, int(n)))
    return out


class Staging:
    def __init__(self, store: ObjectStore):
        self._store = store
        self._index: dict[str, dict[str, Located]] = {}  # user -> hash -> where
        self._packs: dict[str, list[str]] = {}           # pack -> its hashes
        self._cache: OrderedDict[str, bytes] = OrderedDict()

    @classmethod
    async def open(cls, js: JetStreamContext, replicas: int, ttl_s: float) -> Staging:
        try:
            store = await js.object_store(names.BUCKET_WS_STAGING)
        except nats.js.errors.BucketNotFoundError:
            store = await js.create_object_store(names.BUCKET_WS_STAGING, ObjectStoreConfig(
                ttl=ttl_s, replicas=replicas, description="hfai: chunks of workspace pushes not yet committed"))
        staging = cls(store)
        await staging._rebuild()
        return staging

    async def _rebuild(self) -> None:
        try:
            infos = await self._store.list(ignore_deletes=True)
        except nats.js.errors.NotFoundError:
            return
        for info in infos:
            if info.name and "/" in info.name:
                self._add(info.name, parse_description(info.description))
        log.info("staging: %d pack(s) of unfinished pushes", len(self._packs))

    def _add(self, pack: str, chunks: list[tuple[str, int]]) -> None:
        user = pack.split("/", 1)[0]
        where = self._index.setdefault(user, {})
        offset = 0
        for h, n in chunks:
            where.setdefault(h, Located(pack, offset, n))
            offset += n
        self._packs[pack] = [h for h, _ in chunks]

    def held(self, user: str) -> set[str]:
        return set(self._index.get(user, {}))

    async def put(self, user: str, chunks: tuple[ChunkData, ...]) -> None:
        pack = f"{user}/{uuid.uuid4().hex}"
        listing = [(c.hash, len(c.data)) for c in chunks]
        meta = ObjectMeta(name=pack, description=describe(listing),
                          options=ObjectMetaOptions(max_chunk_size=_PACK_MESSAGE_BYTES))
        await self._store.put(pack, b"".join(c.data for c in chunks), meta=meta)
        self._add(pack, listing)

    async def read(self, user: str, h: str) -> bytes:
        where = self._index[user][h]
        data = self._cache.get(where.pack)
        if data is None:
            data = (await self._store.get(where.pack)).data or b""
            self._cache[where.pack] = data
            while len(self._cache) > _CACHED_PACKS:
                self._cache.popitem(last=False)
        self._cache.move_to_end(where.pack)
        return data[where.offset: where.offset + where.length]

    async def release(self, user: str, used: set[str]) -> int:
        """Delete the packs of ``user`` whose every chunk is in ``used`` (now written to disk);
        returns how many."""
        where = self._index.get(user, {})
        done = [p for p, hs in self._packs.items() if p.startswith(user + "/") and set(hs) <= used]
        for pack in done:
            try:
                await self._store.delete(pack)
            except nats.js.errors.NotFoundError:
                pass
            for h in self._packs.pop(pack):
                if h in where and where[h].pack == pack:
                    del where[h]
            self._cache.pop(pack, None)
        return len(done)
