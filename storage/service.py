"""``hfai-storage``: the operator service behind ``hfai workspace`` and ``hfai dataset``.

It answers ``hfai.storage.<user>.<verb>`` (queue group ``hfai-storage``), taking the user from the
subject as the controller does, so NATS permissions alone keep a user to their own workspaces.
Pushed chunks are staged as files beside the workspaces (:mod:`hfai.storage.staging`) and a
commit writes the workspace into ``[storage] workspace_root``. Each request is served in a task of
its own (at most ``MAX_HANDLERS`` at once), so puts are checked and written in parallel threads and
a long commit never holds up the liveness pings of its client or other users' requests. Two owned
loops apply the storage rules: the usage scan (restrict users over ``limit_bytes`` in KV
``hfai_users`` key ``restricted``) and GC (:mod:`hfai.storage.gc`). Decisions are in :mod:`hfai.storage.rules`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from hfai.core import nats as _nats
from hfai.core.config import Config
from hfai.core.daemon import Supervisor, raise_if_cancelled
from hfai.protocol import decode, names
from hfai.protocol import storage as s
from hfai.protocol.errors import Conflict, Forbidden, InvalidRequest
from hfai.protocol.types import RestrictedUsers
from hfai.storage import datasets, rules
from hfai.storage.gc import run_gc
from hfai.storage.staging import Staging, remove_packs, stage_put
from hfai.storage.uploads import Uploads
from hfai.storage.workspace import Workspaces, packed_body, remove_trees

log = logging.getLogger(__name__)

# Hashes in one missing/fetch request: 64 hex characters each, under NATS's default 1 MiB
# max_payload.
MAX_HASHES = 8192
#: Requests served at once; more wait in the subscription's queue (bounded by NATS's pending limits).
MAX_HANDLERS = 16
#: The furthest chunk of a file a put may place (PutRequest.first): a petabyte at 512 KiB.
MAX_CHUNK_INDEX = 2**31
#: Room a reply keeps beside a manifest slice (its other fields, msgpack's framing).
SLICE_ROOM = 4096
#: nats-py reads the service's socket this many bytes at a time (hfai.core.nats.read_in), not 32 KiB.
READ_BYTES = 1024 * 1024
#: Requests waiting for a handler are held by the subscription up to this many bytes (beyond it,
#: NATS drops them as a slow consumer's and their clients time out): some 30 pushing clients'
#: puts in flight (storage/transport.py: IN_FLIGHT_BYTES), where nats-py's default is 64 MiB.
PENDING_BYTES = 512 * 1024 * 1024


def _log_failure(task: asyncio.Future) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("removing used packs or side trees failed (packs expire with the staging TTL, trees "
                    "are removed at the next start): %s", task.exception())


def packed_field(data: bytes, field: str) -> bytes | None:
    """The bytes of the body field ``field`` of the encoded message ``data``, as they were sent
    (the envelope of :mod:`hfai.protocol.codec`: a map whose ``"b"`` is the body, a map of the
    fields), or None. For a message that decoded: they decode to that field's value, the one
    decode() checked. A map may repeat a key, and msgpack's decoding keeps the last: so is the
    last taken here, at both levels (the first could be a manifest nobody checked)."""
    import msgpack

    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(data) + 1)
    unpacker.feed(data)
    found: bytes | None = None
    try:
        for _ in range(unpacker.read_map_header()):
            if unpacker.unpack() != "b":
                unpacker.skip()
                continue
            found = None  # a later body replaces an earlier one, with or without the field
            for _ in range(unpacker.read_map_header()):
                if unpacker.unpack() == field:
                    start = unpacker.tell()
                    unpacker.skip()
                    found = data[start:unpacker.tell()]
                else:
                    unpacker.skip()
    except (ValueError, msgpack.UnpackException):
        return None
    return found


class StorageService:
    def __init__(self, config: Config):
        self.config = config
        self.sc = config.storage
        self.shutdown_timeout_s = self.sc.shutdown_timeout_s
        self.workspaces = Workspaces(self.sc.workspace_root, self.sc.state_dir, defer_removal=True)
        self.uploads = Uploads(Path(self.sc.state_dir) / "uploads")
        self._nc: Client | None = None
        self._sub: Subscription | None = None
        self._supervisor = Supervisor()
        self._users_kv: KeyValue | None = None
        self._staging: Staging | None = None
        # One commit at a time per workspace; different workspaces go on concurrently.
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        # Commits asked for and not yet answered, per workspace (what ws_commit_status reports).
        self._committing: dict[tuple[str, str], int] = {}
        self._closed = False
        self._handling: set[asyncio.Task] = set()
        self._cleaning: set[asyncio.Task] = set()  # packs a commit used, removed after its reply
        self._slots = asyncio.Semaphore(MAX_HANDLERS)
        # Each handler takes its verb's request type (hfai.protocol.storage's verb table, hence Any).
        self._handlers: dict[str, Callable[[str, bool, Any], Awaitable[object]]] = {
            s.WS_MISSING.name: self.ws_missing,
            s.WS_PUT.name: self.ws_put,
            s.WS_COMMIT.name: self.ws_commit,
            s.WS_COMMIT_STATUS.name: self.ws_commit_status,
            s.WS_CURRENT.name: self.ws_current,
            s.WS_MANIFEST_PART.name: self.ws_manifest_part,
            s.WS_MANIFEST_SLICE.name: self.ws_manifest_slice,
            s.WS_FETCH.name: self.ws_fetch,
            s.WS_LIST.name: self.ws_list,
            s.WS_REMOVE.name: self.ws_remove,
            s.USAGE.name: self.usage,
            s.RESTORE.name: self.restore,
            s.DATASET_LIST.name: self.dataset_list,
            s.DATASET_ADD.name: self.dataset_add,
        }

    async def start(self) -> None:
        _nats.read_in(READ_BYTES)
        self._nc = nc = await _nats.connect(self.config, name="hfai-storage")
        js = nc.jetstream()
        buckets = await _nats.ensure_shared_state(js, self.config)
        self._users_kv = buckets.users
        self._staging = await asyncio.to_thread(Staging.open, self.sc.workspace_root, self.sc.staging_ttl_s)
        await asyncio.to_thread(self.uploads.clear)
        await self._recover()
        self._sub = await nc.subscribe(names.STORAGE_WILDCARD, queue=names.STORAGE_QUEUE, cb=self.handle,
                                       pending_bytes_limit=PENDING_BYTES)
        self._supervisor.spawn(self._every(self.sc.scan_interval_s, self.scan), "usage-scan")
        self._supervisor.spawn(self._every(self.sc.gc_interval_s, self.gc), "gc")
        log.info("storage service: workspaces in %s, limit %s", self.sc.workspace_root,
                 rules.human(self.sc.limit_bytes))

    async def _recover(self) -> None:
        """Finish or undo the commits a killed service left, before answering anyone."""
        for user, name, done in await asyncio.to_thread(self.workspaces.recover):
            m = self.workspaces.manifest(user, name)
            if done == "finished" and m is not None:
                self.staging.release(user, {h for f in m.files for h in f.chunks})

    async def failed(self) -> str:
        return await self._supervisor.failed()

    async def close(self) -> None:
        """Stop serving and the rule loops. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        await self._supervisor.stop()
        if self._sub is not None:
            await self._sub.unsubscribe()
        if self._handling or self._cleaning:  # requests under way finish (a commit's thread cannot be cancelled anyway)
            _done, late = await asyncio.wait(self._handling | self._cleaning, timeout=self.shutdown_timeout_s)
            for t in late:
                t.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._nc is not None:
            await self._nc.drain()

    # ------------------------------------------------------------------------- rule loops

    async def _every(self, period_s: float, step: Callable[[], Awaitable[object]]) -> None:
        while True:
            raise_if_cancelled()
            try:
                await step()
            except (TimeoutError, nats.errors.Error) as e:
                log.warning("%s: NATS did not answer (%s); next round in %gs", step.__name__, e, period_s)
            await asyncio.sleep(period_s)

    async def scan(self) -> RestrictedUsers:
        """Measure every user's workspaces; restrict those over the limit."""
        usage = {u: await asyncio.to_thread(self.workspaces.usage, u) for u in self.workspaces.users()}
        over = rules.over_limit(usage, self.sc.limit_bytes)
        return await self._change_restricted(lambda cur: rules.restrict(cur, over))

    async def gc(self) -> None:
        await asyncio.to_thread(run_gc, self.workspaces, self.sc.gc_root, time.time(), self.sc.gc_age_s,
                                self.sc.gc_keep_s)
        self.staging.expire(time.time())

    async def _change_restricted(self, change) -> RestrictedUsers:
        assert self._users_kv is not None, "start() first"
        from hfai.kv import cas_value

        value, _rev, changed = await cas_value(self._users_kv, names.RESTRICTED_KEY, RestrictedUsers, change,
                                               what="setting", missing=RestrictedUsers,
                                               lost_race=(nats.js.errors.APIError,))
        if changed:
            log.info("restricted users now: %s", ", ".join(value.users) or "none")
        return value

    async def _restricted(self) -> RestrictedUsers:
        return await self._change_restricted(lambda _cur: None)

    # ----------------------------------------------------------------------------- serving

    async def handle(self, msg: Msg) -> None:
        """Serve ``msg`` in a task of its own (nats-py awaits a subscription's callback before it
        hands over the next message); waits here while ``MAX_HANDLERS`` are busy."""
        await self._slots.acquire()
        task = asyncio.ensure_future(self._serve(msg))
        self._handling.add(task)
        task.add_done_callback(self._handling.discard)

    async def _serve(self, msg: Msg) -> None:
        try:
            await _nats.answer(msg, self._dispatch, "storage service",
                               lambda e: f"storage service: {e.strerror or e} ({e.filename or ''})")
        finally:
            self._slots.release()

    async def _dispatch(self, subject: str, data: bytes) -> object:
        user, verb, operator = names.parse_storage_subject(subject)
        names.check_token("user name", user)
        if verb not in self._handlers:
            raise InvalidRequest(f"unknown storage verb {verb[:64]!r}; known: {', '.join(s.STORAGE_VERBS)}")
        if verb == s.WS_COMMIT.name:
            # Its manifest is recorded as the request carried it: packing it again would be a
            # large part of a one-edit push.
            req: s.CommitRequest = decode(data, s.CommitRequest)
            if not req.upload:
                return await self.ws_commit(user, operator, req, packed_field(data, "manifest"))
            rules.check_workspace_name(req.workspace)
            # Committing from here on, as ws_commit_status tells the waiting client: decoding a
            # million files' manifest takes seconds.
            with self._committing_now(user, req.workspace):
                whole = await asyncio.to_thread(self.uploads.take, user, req.upload, req.digest)
                m = await asyncio.to_thread(lambda: decode(whole, s.Manifest, max_bytes=s.MAX_MANIFEST_BYTES))
                return await self.ws_commit(user, operator, s.CommitRequest(workspace=req.workspace, manifest=m),
                                            packed_body(whole))
        return await self._handlers[verb](user, operator, decode(data, s.STORAGE_VERBS[verb].request))

    @property
    def served(self) -> frozenset[str]:
        """The verbs this service answers (every one of hfai.protocol.storage's table: a test holds it)."""
        return frozenset(self._handlers)

    def _lock(self, user: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault((user, name), asyncio.Lock())

    @property
    def staging(self) -> Staging:
        assert self._staging is not None, "start() first"
        return self._staging

    # ------------------------------------------------------------------------- workspaces

    async def ws_missing(self, user: str, _op: bool, req: s.MissingRequest) -> s.MissingReply:
        if len(req.hashes) > MAX_HASHES:
            raise InvalidRequest(f"ask for at most {MAX_HASHES} chunks at a time")
        staged = self.staging.held(user)
        asked = [h for h in req.hashes if h not in staged]
        return s.MissingReply(hashes=rules.missing(asked, self.workspaces.holding(user, req.workspace, asked)))

    async def ws_put(self, user: str, _op: bool, req: s.PutRequest) -> s.PutReply:
        rules.check_workspace_name(req.workspace)
        total = sum(len(c.data) for c in req.chunks)
        if total > self.sc.request_bytes or any(len(c.data) > self.sc.chunk_bytes for c in req.chunks):
            raise InvalidRequest(f"a put carries at most {self.sc.request_bytes} bytes in chunks of at most "
                                 f"{self.sc.chunk_bytes}")
        if not 0 <= req.first <= MAX_CHUNK_INDEX:
            raise InvalidRequest(f"chunk index {req.first} is out of range")
        named: tuple[str, ...] = ()
        if req.chunks:
            part = self.staging.part_path(user, req.file) if req.file else ""
            staged, named = await asyncio.to_thread(stage_put, self.staging.user_dir(user), req.chunks,
                                                    frozenset(req.whole), part, req.first, self.sc.chunk_bytes)
            for written in staged:
                self.staging.staged(user, written)
        return s.PutReply(stored=len(req.chunks), hashes=named)

    async def ws_commit(self, user: str, _op: bool, req: s.CommitRequest,
                        packed: bytes | None = None) -> s.WorkspaceInfo:
        rules.check_workspace_name(req.workspace)
        m = req.manifest
        if m.chunk_bytes != self.sc.chunk_bytes:
            raise InvalidRequest(f"chunks of {m.chunk_bytes} bytes; this cluster uses {self.sc.chunk_bytes}")
        with self._committing_now(user, req.workspace):
            # Seconds for a manifest of a million files: in threads, so that the loop keeps
            # answering meanwhile (the pushing client's liveness pings among the rest).
            await asyncio.to_thread(rules.check_manifest, m, self.sc.chunk_bytes)
            async with self._lock(user, req.workspace):
                staged = self.staging.held(user)  # a copy, taken on the loop, where the index changes
                used, lacking = await asyncio.to_thread(self._used_and_lacking, user, req.workspace, m, staged)
                if lacking:
                    # A Conflict, so that the client asks about every chunk and sends these: it
                    # asks first only about the files changed on its side, and a file changed or
                    # removed here since its push is one it does not know of.
                    raise Conflict(f"{len(lacking)} chunk(s) of this push are not on the cluster (never sent, "
                                   "or their files changed there since they were pushed); push again")
                try:
                    await self.workspaces.commit(user, req.workspace, m, lambda h: self.staging.read(user, h),
                                                 lambda h: self.staging.locate(user, h), packed)
                finally:
                    self._remove_later(self.workspaces.take_discarded(), remove_trees)
                self._remove_later(self.staging.forget(user, used))
        return self.workspaces.info(user, req.workspace)

    @contextlib.contextmanager
    def _committing_now(self, user: str, name: str) -> Iterator[None]:
        """Count a commit of ``name`` as asked for and not yet answered (ws_commit_status)."""
        key = (user, name)
        self._committing[key] = self._committing.get(key, 0) + 1
        try:
            yield
        finally:
            self._committing[key] -= 1
            if not self._committing[key]:
                del self._committing[key]

    def _used_and_lacking(self, user: str, name: str, m: s.Manifest, staged: set[str]) \
            -> tuple[set[str], tuple[str, ...]]:
        """The chunks ``m`` uses, and those of them neither the workspace's files nor ``staged``
        hold (blocking)."""
        held = set(self.workspaces.held(user, name)) | staged
        return {h for f in m.files for h in f.chunks}, rules.missing((h for f in m.files for h in f.chunks), held)

    def _remove_later(self, packs: list, remove: Callable[[list], None] = remove_packs) -> None:
        """Remove ``packs`` (or other paths, by ``remove``) in a thread, without holding up the
        reply (close() waits for it)."""
        if packs:
            task = asyncio.ensure_future(asyncio.to_thread(remove, packs))
            self._cleaning.add(task)
            task.add_done_callback(self._cleaning.discard)
            task.add_done_callback(_log_failure)

    async def ws_current(self, user: str, _op: bool, req: s.CurrentRequest) -> s.CurrentReply:
        """Whether the workspace is already exactly the manifest of digest ``req.digest`` (its
        last commit recorded that manifest and every file it lists is on disk at its size: what a
        commit of it would check, so a push that changed nothing ends here, with no commit)."""
        rules.check_workspace_name(req.workspace)
        async with self._lock(user, req.workspace):  # not while a commit of it is under way
            if await asyncio.to_thread(self.workspaces.is_current, user, req.workspace, req.digest):
                return s.CurrentReply(current=True, info=self.workspaces.info(user, req.workspace))
        return s.CurrentReply(current=False)

    async def ws_commit_status(self, user: str, _op: bool, req: s.WorkspaceRequest) -> s.CommitStatus:
        rules.check_workspace_name(req.workspace)
        return s.CommitStatus(workspace=req.workspace, committing=(user, req.workspace) in self._committing)

    async def ws_manifest_part(self, user: str, _op: bool, req: s.ManifestPart) -> s.ManifestPartReply:
        rules.check_workspace_name(req.workspace)
        await asyncio.to_thread(self.uploads.write, user, req.upload, req.offset, req.total, req.data)
        return s.ManifestPartReply(stored=len(req.data))

    async def ws_manifest_slice(self, user: str, _op: bool, req: s.ManifestSliceRequest) -> s.ManifestSlice:
        """A piece of the last committed manifest, at most what one reply can carry."""
        rules.check_workspace_name(req.workspace)
        whole, digest = await asyncio.to_thread(self.workspaces.manifest_bytes, user, req.workspace)
        room = max(1, (self._nc.max_payload if self._nc is not None else 1024 * 1024) - SLICE_ROOM)
        limit = min(req.limit, room) if req.limit > 0 else room
        start = max(0, req.offset)
        return s.ManifestSlice(data=whole[start:start + limit], total=len(whole), digest=digest)

    async def ws_fetch(self, user: str, _op: bool, req: s.FetchRequest) -> s.Chunks:
        """Chunks of the cluster's copy (pull), read from the workspace's files."""
        if len(req.hashes) * self.sc.chunk_bytes > max(self.sc.request_bytes, self.sc.chunk_bytes):
            raise InvalidRequest("fetch fewer chunks at a time")
        rules.check_workspace_name(req.workspace)
        return s.Chunks(chunks=await asyncio.to_thread(self.workspaces.read_chunks, user, req.workspace, req.hashes,
                                                       self.sc.chunk_bytes))

    async def ws_list(self, user: str, _op: bool, _req: s.ListWorkspaces) -> s.WorkspaceList:
        return s.WorkspaceList(workspaces=self.workspaces.listing(user))

    async def ws_remove(self, user: str, _op: bool, req: s.WorkspaceRequest) -> s.WorkspaceInfo:
        async with self._lock(user, req.workspace):
            return await asyncio.to_thread(self.workspaces.remove, user, req.workspace)

    # ------------------------------------------------------------------- usage and restore

    async def usage(self, user: str, _op: bool, _req: s.UsageRequest) -> s.UsageReply:
        used = await asyncio.to_thread(self.workspaces.usage, user)
        restricted = await self._restricted()
        return s.UsageReply(user=user, used=used, limit=self.sc.limit_bytes,
                            restricted=restricted.users.get(user, ""), workspaces=self.workspaces.listing(user))

    async def restore(self, user: str, op: bool, req: s.UsageRequest) -> s.UsageReply:
        """Re-measure the caller's usage and lift their storage restriction if it is within the limit."""
        used = await asyncio.to_thread(self.workspaces.usage, user)
        await self._change_restricted(lambda cur: rules.lift(cur, user, used, self.sc.limit_bytes))
        return await self.usage(user, op, req)

    # ----------------------------------------------------------------------------- datasets

    async def dataset_list(self, _user: str, _op: bool, _req: s.DatasetListRequest) -> s.DatasetList:
        return s.DatasetList(datasets=datasets.listing(self.sc.dataset_root))

    async def dataset_add(self, user: str, op: bool, req: s.DatasetAddRequest) -> s.DatasetInfo:
        if not op:
            raise Forbidden(f"{user} is not an operator; only operators may add datasets")
        return await asyncio.to_thread(datasets.add, self.sc.dataset_root, req.name, req.path, req.group)
