"""The client side of workspaces: push (only the chunks the cluster lacks), pull, and the storage
service's other verbs, over ``hfai.storage.<user>.<verb>``.

A push: hash the tree into a manifest, ask which chunks are missing, send those in packed
requests (at most ``request_bytes`` each, a few in flight), then commit the manifest. Chunks sent
before an interruption stay staged on the cluster, so the next push sends only the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import hashlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypeVar

from hfai._atomic import write_atomic
from hfai.api.client import ApiClient
from hfai.api.workspace import MARKER_DIR, find_root, read_marker, write_marker
from hfai.protocol import encode, names
from hfai.protocol import storage as s
from hfai.protocol.codec import encode_packed, pack
from hfai.protocol.errors import Conflict, ErrorSub, HfaiError, InvalidRequest, NotFound, Unavailable
from hfai.storage import rules
from hfai.storage.chunks import (
    Walked,
    build_manifest,
    chunk_matches,
    quick_index,
    read_chunks,
    read_files,
    read_part,
    scan,
    unchanged_tree,
)

QUICK = "pushed.json"  # size, mtime and chunks of each file at the last push
SENT = "sent.jsonl"  # files sent unhashed by a push not yet committed (_Journal)
#: Put requests in flight: enough to keep the service's threads busy while replies travel, and
#: at most IN_FLIGHT_BYTES of them (the service holds what waits for its handlers in memory).
IN_FLIGHT = 8
IN_FLIGHT_BYTES = 16 * 1024 * 1024
#: Room left in a message beside its chunks (the request's other fields, msgpack's framing); at
#: most a quarter of a small max_payload.
ENVELOPE_BYTES = 64 * 1024
#: What one chunk costs a put or fetch beside its bytes: its name in the request, again in
#: ``whole`` and in the reply's list of names (64 hex digits each), and msgpack's framing. A put
#: of many tiny files is bounded by their count as much as by their bytes.
CHUNK_COST = 160
#: A request's fixed fields (workspace, file key, envelope), bounded by the names' limits.
FRAME_BYTES = 4096
#: Chunks one put carries at most: the service stages a small file's chunk as a file of its own,
#: and a put of tens of thousands of them (what 8 MB of tiny files make) outlasted the request's
#: timeout on a busy disk; a few hundred stay well within it even on a machine under heavy load.
PUT_CHUNKS = 256
#: What one chunk name costs a ws_missing request or reply (64 hex digits and framing).
NAME_COST = 72
#: Hashes one ws_missing request asks about at most (the service takes up to 8,192).
MISSING_BATCH = 4096
#: How often a client waiting for its commit asks whether the service is still at it.
COMMIT_PING_S = 1.0

Progress = Callable[[int], object]
R = TypeVar("R")


@dataclass(frozen=True)
class PushResult:
    info: s.WorkspaceInfo
    files: int
    chunks: int
    sent_chunks: int
    sent_bytes: int
    current: bool = False  # the cluster already had exactly this: nothing sent nor committed


class StorageClient(ApiClient):
    async def scall(self, verb: str, request: object, expect: type[R], timeout_s: float | None = None) -> R:
        """One request to the storage service (``timeout_s``: other than ``[nats] request_timeout_s``)."""
        subject = names.storage_subject(self.user, verb, operator=self.operator)
        # Here, not at the top: hfai.api.client loads nats-py first, its own way (api/_light_nats.py:
        # without aiohttp); by now it has.
        import nats.errors

        try:
            return await self.request(subject, request, expect, timeout=timeout_s)
        except Unavailable as e:
            if e.sub is ErrorSub.NO_RESPONDERS:
                raise Unavailable("no storage service answers; is `hfai-storage` running?",
                                  sub=ErrorSub.NO_RESPONDERS) from None
            raise
        except nats.errors.MaxPayloadError:
            raise InvalidRequest(f"a {verb} request of {len(encode(request))} bytes is over the NATS server's "
                                 f"max_payload ({self._conn.max_payload} bytes); this client should have split it: "
                                 "please report it") from None
        except nats.errors.Error as e:
            raise Unavailable(f"NATS: {e or type(e).__name__} (during {verb}); push again") from None

    def room(self) -> int:
        """The most bytes one message may carry beside its envelope, within the max_payload the
        NATS server announced (a larger message is refused): read from the connection, never
        assumed."""
        announced = self._conn.max_payload
        return max(1, announced - min(ENVELOPE_BYTES, announced // 4))

    def message_bytes(self) -> int:
        """The most bytes of chunks and their costs (:data:`CHUNK_COST`) one message may carry."""
        return max(1, self._conn.max_payload - FRAME_BYTES)

    def request_size(self, configured: int) -> int:
        """The most chunk bytes one put or fetch carries: ``configured`` ([storage] request_bytes),
        within :meth:`room`."""
        return max(1, min(configured, self.room()))


# ---------------------------------------------------------------------------- the marker

def init(root: Path, name: str | None) -> dict:
    name = rules.check_workspace_name(name or root.resolve().name)
    old = read_marker(root) if find_root(root) == root else {}
    data = {**old, "name": name}
    if old.get("name", name) != name:
        # Another workspace now: what the last push recorded (where it went, the local index of
        # what it sent) is the old one's, and the next push must not presume any of it there.
        data.pop("remote", None)
        data.pop("pushed_ts", None)
        (root / MARKER_DIR / QUICK).unlink(missing_ok=True)
        (root / MARKER_DIR / SENT).unlink(missing_ok=True)
    write_marker(root, data)
    return data


# ---------------------------------------------------------------------------- push / pull

@dataclass(frozen=True)
class Outgoing:
    """What a push moves: the manifest, and the chunks of it the cluster lacks."""

    manifest: s.Manifest
    hashes: tuple[str, ...]                      # every distinct chunk of the manifest
    where: dict[str, tuple[s.FileEntry, int]]    # chunk -> (a file holding it, its index there)
    lacking: tuple[str, ...]                     # the chunks to send
    sizes: dict[str, int]                        # chunk -> its length, for those to send
    unhashed: tuple[s.FileEntry, ...] = ()       # files sent unread before, their chunks named by the service

    @property
    def bytes(self) -> int:
        return sum(self.sizes.values()) + sum(f.size for f in self.unhashed)

    @property
    def sending(self) -> int:
        """The chunks to send."""
        return len(self.lacking) + self._unhashed_chunks

    @property
    def chunks(self) -> int:
        """The manifest's distinct chunks (those of the files sent unhashed counted as their own)."""
        return len(self.hashes) + self._unhashed_chunks

    @property
    def _unhashed_chunks(self) -> int:
        return sum(rules.chunk_count(f.size, self.manifest.chunk_bytes) for f in self.unhashed)

    def files(self) -> list[tuple[str, int, int]]:
        """(path, chunks, bytes) to send of each file that has some, in manifest order (a chunk
        several files share is counted at the first)."""
        per: dict[str, list[int]] = {f.path: [rules.chunk_count(f.size, self.manifest.chunk_bytes), f.size]
                                     for f in self.unhashed}
        for h in self.lacking:
            f, _i = self.where[h]
            got = per.setdefault(f.path, [0, 0])
            got[0] += 1
            got[1] += self.sizes[h]
        return [(f.path, per[f.path][0], per[f.path][1]) for f in self.manifest.files if f.path in per]


async def outgoing(client: StorageClient, root: Path, name: str, chunk_bytes: int, on_hash: Progress | None = None,
                   stamps: dict | None = None, on_total: Progress | None = None) -> Outgoing:
    """Hash the workspace at ``root`` (files unchanged since the last push are not read) and ask
    the service which chunks it lacks. ``on_total``: the bytes of the files found, before hashing.
    Changes nothing anywhere (``hfai workspace push --dry-run``); the files a push would send
    unhashed (:func:`hfai.storage.chunks.sent_unhashed`) are listed as moving, unread."""
    with _typed_errors("push", "read", "once it is readable, or list it in .hfignore"):
        known, _last = _read_known(root, chunk_bytes)
        unhashed: list[int] | None = [] if _may_send_unhashed(read_marker(root), known) else None
        manifest = await _manifest(root, chunk_bytes, on_hash, stamps, on_total, known, unhashed=unhashed)
    return await _outgoing_of(client, name, manifest, chunk_bytes, unhashed=unhashed)


async def _manifest(root: Path, chunk_bytes: int, on_hash: Progress | None, stamps: dict | None,
                    on_total: Progress | None, known: dict, walked: Walked | None = None,
                    unhashed: list[int] | None = None) -> s.Manifest:
    return await asyncio.to_thread(build_manifest, root, chunk_bytes, on_hash, known, stamps, on_total=on_total,
                                   walked=walked, unhashed=unhashed)


def _may_send_unhashed(marker: dict, known: dict) -> bool:
    """Whether new files may be sent unhashed: not when this workspace was pushed from here but
    the local index is gone (or was made for other chunks), where the cluster likely holds them."""
    return not (marker.get("remote") and not known)


def _indexed(manifest: s.Manifest, unhashed: list[int] | None = None) -> Outgoing:
    """``manifest``'s chunks and where each is, nothing to send yet (``unhashed``: the places of
    the files without chunks yet, sent whole)."""
    where: dict[str, tuple[s.FileEntry, int]] = {}
    for f in manifest.files:
        for i, h in enumerate(f.chunks):
            where.setdefault(h, (f, i))
    return Outgoing(manifest, tuple(where), where, (), {}, tuple(manifest.files[i] for i in unhashed or ()))


async def _outgoing_of(client: StorageClient, name: str, manifest: s.Manifest, chunk_bytes: int,
                       presumed: set[str] | frozenset[str] = frozenset(),
                       unhashed: list[int] | None = None) -> Outgoing:
    """What to send of ``manifest``: its chunks the service lacks, of those not ``presumed`` there,
    and the files ``unhashed``."""
    out = _indexed(manifest, unhashed)
    asked = tuple(h for h in out.hashes if h not in presumed) if presumed else out.hashes
    return _with_lacking(out, await _ask_missing(client, name, asked), chunk_bytes)


def presumed_there(manifest: s.Manifest, known: dict) -> set[str]:
    """The chunks of the files the local index says the last push sent exactly so (pure): the
    cluster held them then, so a push asks only about the rest. If one is gone there since (a
    job changed its file, the workspace was removed), the commit says so and the push asks again
    about every chunk (:func:`push`)."""
    out: set[str] = set()
    for f in manifest.files:
        seen = known.get(f.path)
        if seen is not None and len(seen) > 2 and seen[0] == f.size and tuple(seen[2]) == f.chunks:
            out.update(f.chunks)
    return out


async def _already_there(client: StorageClient, name: str, digest: str) -> s.WorkspaceInfo | None:
    """The workspace's info if the cluster holds exactly the manifest of ``digest`` already (one
    small request, where asking for every chunk and committing would send the whole manifest
    twice), else None."""
    reply = await client.scall(s.VERB_WS_CURRENT, s.CurrentRequest(workspace=name, digest=digest), s.CurrentReply)
    return reply.info if reply.current else None


def _with_lacking(out: Outgoing, lacking: tuple[str, ...], chunk_bytes: int) -> Outgoing:
    sizes = {h: min(chunk_bytes, out.where[h][0].size - out.where[h][1] * chunk_bytes) for h in lacking}
    return Outgoing(out.manifest, out.hashes, out.where, lacking, sizes, out.unhashed)


async def _ask_missing(client: StorageClient, name: str, hashes: tuple[str, ...]) -> tuple[str, ...]:
    batch = max(1, min(MISSING_BATCH, client.room() // NAME_COST))
    asks = [client.scall(s.VERB_WS_MISSING, s.MissingRequest(workspace=name, hashes=hashes[i:i + batch]),
                         s.MissingReply) for i in range(0, len(hashes), batch)]
    lacking: list[str] = []
    for reply in await asyncio.gather(*asks):  # in flight together: one round trip, not one per batch
        lacking.extend(reply.hashes)
    return tuple(lacking)


async def push(client: StorageClient, root: Path, chunk_bytes: int, request_bytes: int, commit_timeout_s: float,
               on_hash: Progress | None = None, on_send: Progress | None = None,
               on_plan: Callable[[int, int], object] | None = None, bwlimit: int = 0,
               ping_s: float = COMMIT_PING_S, on_total: Progress | None = None,
               walking: asyncio.Future[Walked] | None = None) -> PushResult:
    """Push the workspace at ``root``. ``on_total`` is told the bytes to hash, ``on_plan(chunks,
    bytes to send)`` what will move;
    ``on_hash``/``on_send`` of the bytes hashed and sent; ``bwlimit`` (bytes/s, 0: none) paces the
    sends. ``walking``: the tree's :func:`start_scan`, if begun already (while connecting, say).
    Raises Unavailable within seconds if the service dies during the commit (see :func:`commit`).
    Every failure is an HfaiError (one line from the CLI): a local file that cannot be read
    (removed or made unreadable during the push) is InvalidRequest, naming it."""
    with _typed_errors("push", "read", "once it is readable, or list it in .hfignore"):
        return await _push(client, root, chunk_bytes, request_bytes, commit_timeout_s, on_hash, on_send, on_plan,
                           bwlimit, ping_s, on_total, walking)


@contextlib.contextmanager
def _typed_errors(what: str, verb: str, when: str) -> Iterator[None]:
    """Every failure of a push or pull as an HfaiError (the CLI prints one line, never a
    traceback): a local file's (``verb``: "read", "write") is InvalidRequest naming it."""
    try:
        yield
    except HfaiError:
        raise
    except TimeoutError as e:  # an OSError too: not a file's
        raise Unavailable(f"timed out during the {what} ({e or 'no answer'}); {what} again") from None
    except OSError as e:
        raise InvalidRequest(f"cannot {verb} {e.filename or 'a file of the workspace'} ({e.strerror or e}); "
                             f"{what} again {when}") from None


async def _push(client: StorageClient, root: Path, chunk_bytes: int, request_bytes: int, commit_timeout_s: float,
                on_hash: Progress | None, on_send: Progress | None, on_plan: Callable[[int, int], object] | None,
                bwlimit: int, ping_s: float, on_total: Progress | None,
                walking: asyncio.Future[Walked] | None) -> PushResult:
    marker = read_marker(root)
    name = rules.check_workspace_name(marker["name"])
    request_bytes = client.request_size(request_bytes)
    stamps: dict[str, int] = {}
    if walking is None:
        walking = start_scan(root)
    known, last = _read_known(root, chunk_bytes)  # while the walk runs (its stats leave the GIL free)
    # Asked at once, before the walk ends: if nothing changed here since the last push, its
    # manifest's digest is the question, with no manifest to make (tens of thousands of entries)
    # nor encode, and the service checks its files on disk while this side walks its own. The
    # question changes nothing there: if the walk found a change, its answer is dropped.
    asking = asyncio.ensure_future(_already_there(client, name, last)) if last and marker.get("remote") else None
    try:
        walked = await walking
    except BaseException:
        await drop(asking)
        raise
    asked = ""
    if asking is not None and not unchanged_tree(walked, known):
        await drop(asking)
    elif asking is not None:
        asked = last
        there = await asking
        if there is not None:
            write_marker(root, {**marker, "remote": there.path, "pushed_ts": time.time()})
            return PushResult(there, len(known), len({h for e in known.values() for h in e[2]}), 0, 0, current=True)
    # New files are sent unhashed, named by the service as it takes them: a first push of 10,000
    # small files, or of one checkpoint, reads each byte once, where hashing first read it twice.
    unhashed: list[int] | None = [] if _may_send_unhashed(marker, known) else None
    manifest = await _manifest(root, chunk_bytes, on_hash, stamps, on_total, known, walked, unhashed)
    digest, packed = _digest_and_packed(manifest) if not unhashed else ("", b"")
    there = await _already_there(client, name, digest) if marker.get("remote") and digest not in ("", asked) \
        else None
    if there is not None:
        _remember(root, marker, there, manifest, stamps, chunk_bytes, known, last, digest)
        return PushResult(there, len(manifest.files), len({h for f in manifest.files for h in f.chunks}), 0, 0,
                          current=True)
    presumed = presumed_there(manifest, known) if marker.get("remote") else set()
    out = await _outgoing_of(client, name, manifest, chunk_bytes, presumed, unhashed)
    journal = _Journal(root, walked) if out.unhashed else None
    try:
        sent, named = await _send_lacking(client, root, name, out, chunk_bytes, request_bytes, on_plan, on_send,
                                          bwlimit, journal)
    finally:
        if journal is not None:
            journal.close()
    lacking = out.sending
    if out.unhashed:
        out = _named(out, named, chunk_bytes)
        digest, packed = _digest_and_packed(out.manifest)
    try:
        info = await commit(client, name, out.manifest, commit_timeout_s, ping_s, packed)
    except Conflict:
        # Files on the cluster changed since their push (a job rewrote one, or a service was
        # killed mid-commit), or chunks presumed there are not: the service forgot the changed
        # files, so asking again about every chunk lists what to send.
        out = _with_lacking(out, await _ask_missing(client, name, out.hashes), chunk_bytes)
        more, _named_too = await _send_lacking(client, root, name, out, chunk_bytes, request_bytes, on_plan,
                                               on_send, bwlimit)
        sent += more
        lacking += len(out.lacking)
        info = await commit(client, name, out.manifest, commit_timeout_s, ping_s, packed)
    _remember(root, marker, info, out.manifest, stamps, chunk_bytes, known, last, digest)
    return PushResult(info, len(out.manifest.files), len(out.hashes), lacking, sent)


def _named(out: Outgoing, named: dict[str, tuple[tuple[str, ...], int]], chunk_bytes: int) -> Outgoing:
    """``out`` once its files sent unhashed are sent: its manifest with the names the service
    gave their chunks (``named``: path -> (names, bytes sent)), those chunks sent (pure)."""
    entries = {f.path: f for f in out.unhashed}
    files = []
    for f in out.manifest.files:
        if f.path in entries:
            hs, n = named[f.path]
            f = s.FileEntry(path=f.path, size=n, mode=f.mode, chunks=hs)
        files.append(f)
    done = _indexed(s.Manifest(files=tuple(files), chunk_bytes=out.manifest.chunk_bytes))
    fresh = dict.fromkeys(h for hs, _n in named.values() for h in hs if h not in out.sizes)
    return _with_lacking(done, (*out.lacking, *fresh), chunk_bytes)


def _digest_and_packed(manifest: s.Manifest) -> tuple[str, bytes]:
    """The manifest's digest (:func:`rules.manifest_digest`) and its packed body, from one encoding
    (the commit request carries the body as it is: encoding a large manifest twice would cost the
    push as much again)."""
    whole = encode(manifest)
    empty = s.Manifest()
    head = len(encode(empty)) - len(pack(empty))  # the envelope before the body, the same for every manifest
    return rules.digest_bytes(whole), whole[head:]


def start_scan(root: Path) -> asyncio.Future[Walked]:
    """The walk of the workspace at ``root`` (:func:`hfai.storage.chunks.scan`), begun in a thread."""
    return asyncio.ensure_future(asyncio.to_thread(scan, root))


async def drop(asked: asyncio.Future | None) -> None:
    """Cancel work whose result is no longer wanted, and wait for it to end (its error, if any,
    is not wanted either; a cancellation of the caller still reaches the caller)."""
    if asked is not None:
        asked.cancel()
        await asyncio.gather(asked, return_exceptions=True)


def _remember(root: Path, marker: dict, info: s.WorkspaceInfo, manifest: s.Manifest, stamps: dict,
              chunk_bytes: int, known: dict, last: str, digest: str) -> None:
    """Record the push in the workspace's marker, and the local index for the next one's quick
    check with the digest of the manifest pushed (rewritten only if it changed: for 10,000 files
    it is a few MB of JSON); the journal of files sent unhashed is then no longer needed."""
    write_marker(root, {**marker, "remote": info.path, "pushed_ts": time.time()})
    files = quick_index(root, manifest, stamps, known)
    if files != known or digest != last:
        write_atomic(root / MARKER_DIR / QUICK, json.dumps({"chunk_bytes": chunk_bytes, "files": files,
                                                             "digest": digest}))
    (root / MARKER_DIR / SENT).unlink(missing_ok=True)


class _Journal:
    """The files a push sent unhashed, with the names the service gave them, appended as each
    put is answered (``.hfai/sent.jsonl``, a line a file, as the local index's entries): a push
    killed midway leaves them staged on the cluster, and the next one reads them with the local
    index (:func:`_read_known`), so it neither reads nor sends them again. A file of several
    chunks is listed before its first put, at its size and with no chunks: the next push then
    hashes it (:func:`hfai.storage.chunks.sent_unhashed`) and sends only the chunks the cluster
    lacks, where sending it unhashed again would send them all."""

    def __init__(self, root: Path, walked: Walked):
        self.path = root / MARKER_DIR / SENT
        self.stats = dict(walked)
        self._fd: int | None = None

    def add(self, files: list[tuple[s.FileEntry, tuple[str, ...], int]]) -> None:
        """(entry, names, bytes sent) of each file of a put answered (or begun: no names)."""
        lines = []
        for f, hs, n in files:
            st = self.stats[f.path]  # as the walk saw it, before it was read: a change since shows
            lines.append(f'[{json.dumps(f.path)},{n},{st.st_mtime_ns},{json.dumps(list(hs))},{st.st_ino},'
                         f'{f.mode}]\n')
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(self._fd, "".join(lines).encode())  # whole lines in one write: a kill leaves no half line

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _read_known(root: Path, chunk_bytes: int) -> tuple[dict, str]:
    """:func:`_read_quick`, with what the journal of a push that did not finish adds: its files
    are staged on the cluster, and the last push's digest no longer tells an unchanged tree."""
    known, last = _read_quick(root, chunk_bytes)
    try:
        text = (root / MARKER_DIR / SENT).read_text()
    except (OSError, ValueError):
        return known, last
    added = {}
    for line in text.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue  # a line cut short (a full disk): its file is sent again
        if isinstance(item, list) and len(item) == 6 and isinstance(item[0], str) and isinstance(item[3], list):
            added[item[0]] = item[1:]
    return ({**known, **added}, "") if added else (known, last)


async def _send_lacking(client, root, name, out: Outgoing, chunk_bytes, request_bytes, on_plan, on_send,
                        bwlimit, journal: _Journal | None = None) -> tuple[int, dict[str, tuple[tuple[str, ...], int]]]:
    """Send what ``out`` lacks; returns the bytes sent and, for the files sent unhashed, path ->
    (the names the service gave their chunks, bytes sent)."""
    if on_plan is not None:
        on_plan(out.sending, out.bytes)
    return await _send(client, root, name, out, chunk_bytes, request_bytes, on_send, bwlimit, journal)


async def commit(client: StorageClient, name: str, manifest: s.Manifest, timeout_s: float,
                 ping_s: float = COMMIT_PING_S, packed: bytes | None = None) -> s.WorkspaceInfo:
    """Commit ``manifest`` (``packed``: its packed body, if made already) and wait for it, asking
    every ``ping_s`` whether the service is still committing: a service that died (no
    responders), hangs (no answer within ``[nats] request_timeout_s``) or restarted (no longer
    committing it) ends the wait with Unavailable within seconds, not ``timeout_s``."""
    if packed is None:
        packed = pack(manifest)
    request: object = encode_packed(s.CommitRequest(workspace=name, manifest=manifest), manifest=packed)
    if len(packed) > client.room():  # the manifest goes ahead in pieces, the commit names them
        whole = _manifest_head() + packed
        request = s.CommitRequest(workspace=name, manifest=s.Manifest(), upload=await _upload(client, name, whole),
                                  digest=hashlib.sha256(whole).hexdigest())
    ask = asyncio.ensure_future(client.scall(s.VERB_WS_COMMIT, request, s.WorkspaceInfo, timeout_s=timeout_s))
    forgotten = 0
    try:
        while True:
            done, _ = await asyncio.wait({ask}, timeout=ping_s)
            if done:
                return ask.result()
            seen = await _commit_alive(client, name)
            forgotten = forgotten + 1 if seen is CommitSeen.FORGOTTEN else 0
            if ask.done():
                return ask.result()
            # One "not committing" can be the reply still on its way; two in a row are not.
            if seen is not CommitSeen.GOING and (seen is not CommitSeen.FORGOTTEN or forgotten >= 2):
                raise Unavailable(f"the storage service {seen.value.format(name=name)}. A commit is all "
                                  "or nothing: jobs see the workspace as before this push or as pushed, never a "
                                  "mix, and the service finishes or undoes it when it starts. Push again once "
                                  "`hfai-storage` runs (the chunks already sent are not sent again).")
    finally:
        if not ask.done():
            ask.cancel()
        await asyncio.gather(ask, return_exceptions=True)


class CommitSeen(enum.Enum):
    """What a ping of a commit in progress found (:func:`_commit_alive`); each value words it."""

    GOING = ""  # the service is at it
    FORGOTTEN = "restarted while committing workspace {name}"  # it answers, committing nothing
    NOT_RUNNING = "stopped answering while committing workspace {name} (it is not running)"
    SILENT = "stopped answering while committing workspace {name} (it is hung or cut off from NATS)"


#: Manifest pieces in flight at once.
PIECES_IN_FLIGHT = 4


@functools.cache
def _manifest_head() -> bytes:
    """What encode() writes before a manifest's packed body (the same for every manifest)."""
    empty = s.Manifest()
    whole, body = encode(empty), pack(empty)
    return whole[:len(whole) - len(body)]


async def _upload(client: StorageClient, name: str, whole: bytes) -> str:
    """Send the encoded manifest ``whole`` in pieces that fit one message each; its upload id."""
    upload = os.urandom(16).hex()
    piece = client.room()
    offsets = list(range(0, len(whole), piece))
    for i in range(0, len(offsets), PIECES_IN_FLIGHT):
        await asyncio.gather(*(client.scall(s.VERB_WS_MANIFEST_PART, s.ManifestPart(
            workspace=name, upload=upload, offset=at, total=len(whole), data=whole[at:at + piece]),
            s.ManifestPartReply) for at in offsets[i:i + PIECES_IN_FLIGHT]))
    return upload


async def _commit_alive(client: StorageClient, name: str) -> CommitSeen:
    """Whether the service is still committing ``name`` for us, and if not, what happened to it."""
    try:
        status = await client.scall(s.VERB_WS_COMMIT_STATUS, s.WorkspaceRequest(workspace=name), s.CommitStatus)
    except Unavailable as e:
        return CommitSeen.NOT_RUNNING if e.sub is ErrorSub.NO_RESPONDERS else CommitSeen.SILENT
    return CommitSeen.GOING if status.committing else CommitSeen.FORGOTTEN


def _read_quick(root: Path, chunk_bytes: int) -> tuple[dict, str]:
    """The local index (path -> entry) and the digest of the manifest last pushed ("" if none)."""
    try:
        data = json.loads((root / MARKER_DIR / QUICK).read_text())
    except (OSError, ValueError):
        return {}, ""
    if not isinstance(data, dict) or data.get("chunk_bytes") != chunk_bytes:
        return {}, ""
    files, digest = data.get("files"), data.get("digest")
    return (files if isinstance(files, dict) else {}), (digest if isinstance(digest, str) else "")


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
    import hashlib

    sent = set(lacking)
    files = {id(f): f for f, _i in where.values() if len(f.chunks) > 1}
    out: dict[str, str] = {}
    for f in files.values():
        if all(h in sent and where[h][0] is f and where[h][1] == i for i, h in enumerate(f.chunks)):
            key = hashlib.sha256("\n".join(f.chunks).encode()).hexdigest()
            out.update((h, key) for h in f.chunks)
    return out


async def _send(client, root, name, out: Outgoing, chunk_bytes, request_bytes, on_send, bwlimit,
                journal: _Journal | None) -> tuple[int, dict[str, tuple[tuple[str, ...], int]]]:
    where, lacking = out.where, list(out.lacking)
    queue: asyncio.Queue[Callable[[], Awaitable[int]] | None] = asyncio.Queue(maxsize=IN_FLIGHT)
    part_of = parts(lacking, where)
    named: dict[str, tuple[tuple[str, ...], int]] = {}
    sent = 0
    started = time.monotonic()

    async def put_named(group: list[str]) -> int:
        # One thread call a request; the service checks every chunk's hash (a file changed
        # since it was hashed is refused there), so the client does not hash twice.
        datas = await asyncio.to_thread(read_chunks, root, [where[h] for h in group], chunk_bytes)
        chunks = [s.ChunkData(hash=h, data=d) for h, d in zip(group, datas, strict=True)]
        whole = tuple(h for h in group if len(where[h][0].chunks) == 1)
        key, first = part_of.get(group[0], ""), where[group[0]][1]
        await client.scall(s.VERB_WS_PUT, s.PutRequest(workspace=name, chunks=tuple(chunks), whole=whole,
                                                       file=key, first=first if key else 0), s.PutReply)
        return sum(len(d) for d in datas)

    async def put_unhashed(files: list[s.FileEntry]) -> int:
        datas = await asyncio.to_thread(read_files, root, [f.path for f in files], chunk_bytes)
        if sum(len(d) for d in datas) > request_bytes:
            raise InvalidRequest("files grew while they were pushed; push again")
        chunks = tuple(s.ChunkData(hash="", data=d) for d in datas if d)  # a file emptied meanwhile has none
        names_of = iter(await _put_unnamed(client, name, chunks))
        done: list[tuple[s.FileEntry, tuple[str, ...], int]] = [
            (f, (next(names_of),) if d else (), len(d)) for f, d in zip(files, datas, strict=True)]
        named.update((f.path, (hs, n)) for f, hs, n in done)
        if journal is not None:
            journal.add(done)
        return sum(len(d) for d in datas)

    # A large new file's chunks, unhashed, at their places in a part file of a key of this push's
    # own (the service names them): the commit then links that file, as it links a hashed one's.
    part_names: dict[str, dict[int, str]] = {f.path: {} for f in out.unhashed if f.size > chunk_bytes}
    begun: set[str] = set()

    async def put_part(f: s.FileEntry, key: str, first: int, count: int) -> int:
        if f.path not in begun and journal is not None:
            journal.add([(f, (), f.size)])  # before any of it is staged: see _Journal
        begun.add(f.path)
        datas = await asyncio.to_thread(read_part, root, f, first, count, chunk_bytes)
        hs = await _put_unnamed(client, name, tuple(s.ChunkData(hash="", data=d) for d in datas), key, first)
        part_names[f.path].update(enumerate(hs, start=first))
        return sum(len(d) for d in datas)

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

    small = {f.path: f for f in out.unhashed if f.path not in part_names}
    works: list[Callable[[], Awaitable[int]]] = [
        partial(put_named, g) for g in packs(lacking, out.sizes, request_bytes, part_of, client.message_bytes(),
                                             PUT_CHUNKS)]
    works += [partial(put_unhashed, [small[p] for p in g])
              for g in packs(list(small), {f.path: f.size for f in small.values()}, request_bytes,
                             message_bytes=client.message_bytes(), max_chunks=PUT_CHUNKS)]
    per = max(1, request_bytes // chunk_bytes)
    for f in out.unhashed:
        if f.path in part_names:
            key = os.urandom(32).hex()
            n = rules.chunk_count(f.size, chunk_bytes)
            works += [partial(put_part, f, key, i, min(per, n - i)) for i in range(0, n, per)]
    in_flight = 1 if bwlimit else max(2, min(IN_FLIGHT, IN_FLIGHT_BYTES // max(1, request_bytes)))
    senders = [asyncio.create_task(sender()) for _ in range(in_flight)]
    put: asyncio.Future[None] | None = None
    try:
        for work in works:
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
    for f in out.unhashed:
        if f.path in part_names:  # every put answered (else its error is raised above)
            got = part_names[f.path]
            named[f.path] = (tuple(got[i] for i in range(rules.chunk_count(f.size, chunk_bytes))), f.size)
    return sent, named


async def _put_unnamed(client: StorageClient, name: str, chunks: tuple[s.ChunkData, ...], key: str = "",
                       first: int = 0) -> tuple[str, ...]:
    """Put chunks the client did not hash (of one file's part file with ``key``); their names."""
    if not chunks:
        return ()
    reply = await client.scall(s.VERB_WS_PUT, s.PutRequest(workspace=name, chunks=chunks, file=key, first=first),
                               s.PutReply)
    return reply.hashes


def _holds(path: Path, chunks: tuple[str, ...], chunk_bytes: int) -> bool:
    """Whether the file at ``path`` is exactly these chunks."""
    from hfai.storage.chunks import file_chunks

    n = 0
    for data in file_chunks(path, chunk_bytes):  # one chunk in memory at a time
        if n >= len(chunks) or not chunk_matches(chunks[n], data):
            return False
        n += 1
    return n == len(chunks)


async def pull(client: StorageClient, name: str, dest: Path, request_bytes: int,
               on_bytes: Progress | None = None) -> int:
    """Write the cluster's copy of workspace ``name`` into ``dest``; returns the files written.
    Files already there with the right content are left alone. Chunks are fetched across files,
    as many a request as fit (a tree of many small files is not a request a file)."""
    with _typed_errors("pull", "write", "once there is room and permission"):
        return await _pull(client, name, dest, request_bytes, on_bytes)


async def _pull(client: StorageClient, name: str, dest: Path, request_bytes: int, on_bytes: Progress | None) -> int:
    request_bytes = client.request_size(request_bytes)
    m = await _pulled_manifest(client, name)
    rules.check_manifest(m, m.chunk_bytes)
    todo = [f for f in m.files if not ((dest / f.path).is_file() and _holds(dest / f.path, f.chunks, m.chunk_bytes))]
    per = max(1, min(request_bytes // m.chunk_bytes, (client.message_bytes() - request_bytes) // CHUNK_COST))
    slots = [(f, i, h) for f in todo for i, h in enumerate(f.chunks)]
    writing: dict[str, int] = {}
    try:
        for f in todo:
            if not f.chunks:
                _open_pulled(dest, f, writing)
                _finish_pulled(dest, f, writing.pop(f.path))
        for at in range(0, len(slots), per):
            batch = slots[at:at + per]
            got = await client.scall(s.VERB_WS_FETCH, s.FetchRequest(
                workspace=name, hashes=tuple(dict.fromkeys(h for _f, _i, h in batch))), s.Chunks)
            data = {c.hash: c.data for c in got.chunks}
            for f, i, h in batch:
                fd = writing[f.path] if i else _open_pulled(dest, f, writing)  # opened at its first chunk
                os.write(fd, data[h])
                if on_bytes is not None:
                    on_bytes(len(data[h]))
                if i == len(f.chunks) - 1:
                    _finish_pulled(dest, f, writing.pop(f.path))
    finally:
        for fd in writing.values():
            os.close(fd)
    if not m.files and not dest.exists():
        raise NotFound(f"workspace {name!r} is empty")
    return len(todo)


def _tmp_of(target: Path) -> Path:
    return target.with_name(f".{target.name}.hfai-tmp")


def _open_pulled(dest: Path, f: s.FileEntry, writing: dict[str, int]) -> int:
    target = dest / f.path
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = writing[f.path] = os.open(_tmp_of(target), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    return fd


def _finish_pulled(dest: Path, f: s.FileEntry, fd: int) -> None:
    os.close(fd)
    target = dest / f.path
    os.chmod(_tmp_of(target), f.mode & 0o777)
    os.replace(_tmp_of(target), target)


async def _pulled_manifest(client: StorageClient, name: str, tries: int = 3) -> s.Manifest:
    """The workspace's manifest, read in slices that fit one reply each (a manifest of many files
    is larger than one message); read again if a commit changed it between two slices."""
    from hfai.protocol import decode

    for _ in range(tries):
        first = await client.scall(s.VERB_WS_MANIFEST_SLICE,
                                   s.ManifestSliceRequest(workspace=name, limit=client.room()), s.ManifestSlice)
        parts, got = [first.data], len(first.data)
        while got < first.total:
            more = await client.scall(s.VERB_WS_MANIFEST_SLICE, s.ManifestSliceRequest(
                workspace=name, offset=got, limit=client.room()), s.ManifestSlice)
            if more.digest != first.digest or not more.data:
                break
            parts.append(more.data)
            got += len(more.data)
        whole = b"".join(parts)
        if hashlib.sha256(whole).hexdigest() == first.digest:
            return decode(whole, s.Manifest, max_bytes=s.MAX_MANIFEST_BYTES)
    raise Unavailable(f"workspace {name!r} kept changing while its manifest was read; pull again")
