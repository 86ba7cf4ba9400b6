"""A push's and a pull's messages, each within the NATS server's max_payload: chunks packed into
put requests (:func:`packs`, pure) and sent a few in flight (:func:`send`), the question of which
chunks the service lacks in batches, and a manifest too large for one message sent ahead in
pieces. What one message may carry is the connection's (:class:`StorageClient`)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from hfai.protocol import storage as s
from hfai.protocol.errors import InvalidRequest
from hfai.storage import rules
from hfai.storage.chunks import read_chunks, read_files, read_part
from hfai.storage.client import CHUNK_COST, StorageClient
from hfai.storage.manifest import Outgoing, Progress
from hfai.storage.marker import Journal

#: Put requests in flight: enough to keep the service's threads busy while replies travel, and
#: at most IN_FLIGHT_BYTES of them (the service holds what waits for its handlers in memory).
IN_FLIGHT = 8
IN_FLIGHT_BYTES = 16 * 1024 * 1024
#: Chunks one put carries at most: the service stages a small file's chunk as a file of its own,
#: and a put of tens of thousands of them (what 8 MB of tiny files make) outlasted the request's
#: timeout on a busy disk; a few hundred stay well within it even on a machine under heavy load.
PUT_CHUNKS = 256
#: What one chunk name costs a ws_missing request or reply (64 hex digits and framing).
NAME_COST = 72
#: Hashes one ws_missing request asks about at most (the service takes up to 8,192).
MISSING_BATCH = 4096
#: Manifest pieces in flight at once.
PIECES_IN_FLIGHT = 4

#: path -> (the names the service gave a file sent unhashed, its bytes sent).
Named = dict[str, tuple[tuple[str, ...], int]]


def packs(lacking: list[str], sizes: dict[str, int], request_bytes: int,
          part_of: dict[str, str] | None = None, message_bytes: int = 0, max_chunks: int = 0) -> list[list[str]]:
    """Group chunks into requests of at most ``request_bytes`` of chunks (pure; a chunk alone may
    fill one). ``message_bytes``: if set, also at most that many counting :data:`CHUNK_COST` a
    chunk (many tiny files); ``max_chunks``: if set, at most that many chunks. ``part_of``:
    chunk -> the key of the file it is sent as part of; such chunks go in requests of that
    file's alone (the service then writes them at their places in one file)."""
    out: list[list[str]] = []
    cur: list[str] = []
    used = 0
    part_of = part_of or {}
    for h in lacking:
        over = used + sizes[h] > request_bytes or (
            message_bytes > 0 and used + sizes[h] + (len(cur) + 1) * CHUNK_COST > message_bytes) or (
            0 < max_chunks <= len(cur))
        if cur and (over or part_of.get(h) != part_of.get(cur[-1])):
            out.append(cur)
            cur, used = [], 0
        cur.append(h)
        used += sizes[h]
    if cur:
        out.append(cur)
    return out


def parts(lacking: list[str], where: dict[str, tuple[s.FileEntry, int]]) -> dict[str, str]:
    """chunk -> file key, for the chunks of each file of several chunks whose every chunk is sent
    and first found in it, in order (pure): the service can keep such a file whole, at its places
    (PutRequest.file). The key is the SHA-256 of the file's chunk names, one a line."""
    sent = set(lacking)
    files = {id(f): f for f, _i in where.values() if len(f.chunks) > 1}
    out: dict[str, str] = {}
    for f in files.values():
        if all(h in sent and where[h][0] is f and where[h][1] == i for i, h in enumerate(f.chunks)):
            key = hashlib.sha256("\n".join(f.chunks).encode()).hexdigest()
            out.update((h, key) for h in f.chunks)
    return out


async def ask_missing(client: StorageClient, name: str, hashes: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``hashes`` the service lacks, asked in batches that fit a message each."""
    batch = max(1, min(MISSING_BATCH, client.room() // NAME_COST))
    asks = [client.scall(s.WS_MISSING, s.MissingRequest(workspace=name, hashes=hashes[i:i + batch]))
            for i in range(0, len(hashes), batch)]
    lacking: list[str] = []
    for reply in await asyncio.gather(*asks):  # in flight together: one round trip, not one per batch
        lacking.extend(reply.hashes)
    return tuple(lacking)


async def upload(client: StorageClient, name: str, whole: bytes) -> str:
    """Send the encoded manifest ``whole`` in pieces that fit one message each; its upload id."""
    upload_id = os.urandom(16).hex()
    piece = client.room()
    offsets = list(range(0, len(whole), piece))
    for i in range(0, len(offsets), PIECES_IN_FLIGHT):
        await asyncio.gather(*(client.scall(s.WS_MANIFEST_PART, s.ManifestPart(
            workspace=name, upload=upload_id, offset=at, total=len(whole), data=whole[at:at + piece]))
            for at in offsets[i:i + PIECES_IN_FLIGHT]))
    return upload_id


async def put_unnamed(client: StorageClient, name: str, chunks: tuple[s.ChunkData, ...], key: str = "",
                      first: int = 0) -> tuple[str, ...]:
    """Put chunks the client did not hash (of one file's part file with ``key``); their names."""
    if not chunks:
        return ()
    reply = await client.scall(s.WS_PUT, s.PutRequest(workspace=name, chunks=chunks, file=key, first=first))
    return reply.hashes


class _Sends:
    """The puts of one :func:`send`, each a unit of work for the senders: chunks named here, small
    files sent unhashed, and parts of a large file sent unhashed."""

    def __init__(self, client: StorageClient, root: Path, name: str, out: Outgoing, chunk_bytes: int,
                 request_bytes: int, journal: Journal | None):
        self.client, self.root, self.name, self.out = client, root, name, out
        self.chunk_bytes, self.request_bytes, self.journal = chunk_bytes, request_bytes, journal
        self.part_of = parts(list(out.lacking), out.where)
        self.named: Named = {}
        # A large new file's chunks, unhashed, at their places in a part file of a key of this
        # push's own (the service names them): the commit then links that file, as it links a
        # hashed one's.
        self.part_names: dict[str, dict[int, str]] = {f.path: {} for f in out.unhashed if f.size > chunk_bytes}
        self.begun: set[str] = set()

    def works(self) -> list[Callable[[], Awaitable[int]]]:
        out, chunk_bytes, request_bytes = self.out, self.chunk_bytes, self.request_bytes
        small = {f.path: f for f in out.unhashed if f.path not in self.part_names}
        works: list[Callable[[], Awaitable[int]]] = [
            partial(self.put_named, g) for g in packs(list(out.lacking), out.sizes, request_bytes, self.part_of,
                                                      self.client.message_bytes(), PUT_CHUNKS)]
        works += [partial(self.put_unhashed, [small[p] for p in g])
                  for g in packs(list(small), {f.path: f.size for f in small.values()}, request_bytes,
                                 message_bytes=self.client.message_bytes(), max_chunks=PUT_CHUNKS)]
        per = max(1, request_bytes // chunk_bytes)
        for f in out.unhashed:
            if f.path in self.part_names:
                key = os.urandom(32).hex()
                n = rules.chunk_count(f.size, chunk_bytes)
                works += [partial(self.put_part, f, key, i, min(per, n - i)) for i in range(0, n, per)]
        return works

    async def put_named(self, group: list[str]) -> int:
        # One thread call a request; the service checks every chunk's hash (a file changed
        # since it was hashed is refused there), so the client does not hash twice.
        where = self.out.where
        datas = await asyncio.to_thread(read_chunks, self.root, [where[h] for h in group], self.chunk_bytes)
        chunks = [s.ChunkData(hash=h, data=d) for h, d in zip(group, datas, strict=True)]
        whole = tuple(h for h in group if len(where[h][0].chunks) == 1)
        key, first = self.part_of.get(group[0], ""), where[group[0]][1]
        await self.client.scall(s.WS_PUT, s.PutRequest(workspace=self.name, chunks=tuple(chunks), whole=whole,
                                                       file=key, first=first if key else 0))
        return sum(len(d) for d in datas)

    async def put_unhashed(self, files: list[s.FileEntry]) -> int:
        datas = await asyncio.to_thread(read_files, self.root, [f.path for f in files], self.chunk_bytes)
        if sum(len(d) for d in datas) > self.request_bytes:
            raise InvalidRequest("files grew while they were pushed; push again")
        chunks = tuple(s.ChunkData(hash="", data=d) for d in datas if d)  # a file emptied meanwhile has none
        names_of = iter(await put_unnamed(self.client, self.name, chunks))
        done: list[tuple[s.FileEntry, tuple[str, ...], int]] = [
            (f, (next(names_of),) if d else (), len(d)) for f, d in zip(files, datas, strict=True)]
        self.named.update((f.path, (hs, n)) for f, hs, n in done)
        if self.journal is not None:
            self.journal.add(done)
        return sum(len(d) for d in datas)

    async def put_part(self, f: s.FileEntry, key: str, first: int, count: int) -> int:
        if f.path not in self.begun and self.journal is not None:
            self.journal.add([(f, (), f.size)])  # before any of it is staged: see Journal
        self.begun.add(f.path)
        datas = await asyncio.to_thread(read_part, self.root, f, first, count, self.chunk_bytes)
        hs = await put_unnamed(self.client, self.name, tuple(s.ChunkData(hash="", data=d) for d in datas), key, first)
        self.part_names[f.path].update(enumerate(hs, start=first))
        return sum(len(d) for d in datas)

    def all_named(self) -> Named:
        """Once every put is answered: path -> (names, bytes) of each file sent unhashed."""
        for f in self.out.unhashed:
            if f.path in self.part_names:
                got = self.part_names[f.path]
                self.named[f.path] = (tuple(got[i] for i in range(rules.chunk_count(f.size, self.chunk_bytes))),
                                      f.size)
        return self.named


async def send(client: StorageClient, root: Path, name: str, out: Outgoing, chunk_bytes: int, request_bytes: int,
               on_send: Progress | None, bwlimit: int, journal: Journal | None) -> tuple[int, Named]:
    """Send what ``out`` lacks, a few puts in flight (one if ``bwlimit``, bytes/s, paces them);
    the bytes sent and, for the files sent unhashed, the names the service gave their chunks."""
    sends = _Sends(client, root, name, out, chunk_bytes, request_bytes, journal)
    queue: asyncio.Queue[Callable[[], Awaitable[int]] | None] = asyncio.Queue(maxsize=IN_FLIGHT)
    sent = 0
    started = time.monotonic()

    async def sender() -> None:
        nonlocal sent
        while (work := await queue.get()) is not None:
            n = await work()
            sent += n
            if on_send is not None:
                on_send(n)
            if bwlimit:
                ahead = sent / bwlimit - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)

    in_flight = 1 if bwlimit else max(2, min(IN_FLIGHT, IN_FLIGHT_BYTES // max(1, request_bytes)))
    senders = [asyncio.create_task(sender()) for _ in range(in_flight)]
    put: asyncio.Future[None] | None = None
    try:
        for work in sends.works():
            put = asyncio.ensure_future(queue.put(work))
            done, _ = await asyncio.wait({put, *senders}, return_when=asyncio.FIRST_COMPLETED)
            for t in done - {put}:
                t.result()  # a sender failed: raise its error
            if not put.done():
                raise RuntimeError("every sender stopped")
        for _ in senders:
            await queue.put(None)
        await asyncio.gather(*senders)
    finally:
        owned: list[asyncio.Future[None]] = [*senders, *([put] if put else [])]  # a put waiting for room too
        for waiting in owned:
            waiting.cancel()
        await asyncio.gather(*owned, return_exceptions=True)
    return sent, sends.all_named()  # every put answered (else its error is raised above)
