"""A push of a workspace: hash the tree into a manifest (files unchanged since the last push are
not read), ask which chunks the cluster lacks, send those in packed requests (at most
``request_bytes`` each, a few in flight), then commit the manifest and record the push in
``.hfai``. Chunks sent before an interruption stay staged on the cluster, so the next push sends
only the rest."""

from __future__ import annotations

import asyncio
import enum
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from hfai.api.workspace import MARKER_DIR, Marker, read_marker, write_marker
from hfai.protocol import storage as s
from hfai.protocol.codec import Encoded, encode_packed, pack
from hfai.protocol.errors import Conflict, ErrorSub, Unavailable
from hfai.storage import manifest as mf
from hfai.storage import rules, transport
from hfai.storage.chunks import Walked, quick_index, unchanged_tree
from hfai.storage.client import StorageClient, typed_errors
from hfai.storage.manifest import Outgoing, Progress, start_scan
from hfai.storage.marker import SENT, Index, Journal, PushedIndex, read_known

#: How often a client waiting for its commit asks whether the service is still at it.
COMMIT_PING_S = 1.0


@dataclass(frozen=True)
class PushResult:
    info: s.WorkspaceInfo
    files: int
    chunks: int
    sent_chunks: int
    sent_bytes: int
    current: bool = False  # the cluster already had exactly this: nothing sent nor committed


async def outgoing(client: StorageClient, root: Path, name: str, chunk_bytes: int, on_hash: Progress | None = None,
                   stamps: dict | None = None, on_total: Progress | None = None) -> Outgoing:
    """Hash the workspace at ``root`` (files unchanged since the last push are not read) and ask
    the service which chunks it lacks. ``on_total``: the bytes of the files found, before hashing.
    Changes nothing anywhere (``hfai workspace push --dry-run``); the files a push would send
    unhashed (:func:`hfai.storage.chunks.sent_unhashed`) are listed as moving, unread."""
    with typed_errors("push", "read", "once it is readable, or list it in .hfignore"):
        known, _last = read_known(root, chunk_bytes)
        unhashed: list[int] | None = [] if mf.may_send_unhashed(read_marker(root), known) else None
        manifest = await mf.make(root, chunk_bytes, on_hash, stamps, on_total, known, unhashed=unhashed)
    return await _outgoing_of(client, name, manifest, chunk_bytes, unhashed=unhashed)


async def _outgoing_of(client: StorageClient, name: str, manifest: s.Manifest, chunk_bytes: int,
                       presumed: set[str] | frozenset[str] = frozenset(),
                       unhashed: list[int] | None = None) -> Outgoing:
    """What to send of ``manifest``: its chunks the service lacks, of those not ``presumed`` there,
    and the files ``unhashed``."""
    out = mf.indexed(manifest, unhashed)
    asked = tuple(h for h in out.hashes if h not in presumed) if presumed else out.hashes
    return mf.with_lacking(out, await transport.ask_missing(client, name, asked), chunk_bytes)


async def _already_there(client: StorageClient, name: str, digest: str) -> s.WorkspaceInfo | None:
    """The workspace's info if the cluster holds exactly the manifest of ``digest`` already (one
    small request, where asking for every chunk and committing would send the whole manifest
    twice), else None."""
    reply = await client.scall(s.WS_CURRENT, s.CurrentRequest(workspace=name, digest=digest))
    return reply.info if reply.current else None


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
    with typed_errors("push", "read", "once it is readable, or list it in .hfignore"):
        return await _push(client, root, chunk_bytes, request_bytes, commit_timeout_s, on_hash, on_send, on_plan,
                           bwlimit, ping_s, on_total, walking)


async def _push(client: StorageClient, root: Path, chunk_bytes: int, request_bytes: int, commit_timeout_s: float,
                on_hash: Progress | None, on_send: Progress | None, on_plan: Callable[[int, int], object] | None,
                bwlimit: int, ping_s: float, on_total: Progress | None,
                walking: asyncio.Future[Walked] | None) -> PushResult:
    marker = read_marker(root)
    name = rules.check_workspace_name(marker.name)
    if walking is None:
        walking = start_scan(root)
    known, last = read_known(root, chunk_bytes)  # while the walk runs (its stats leave the GIL free)
    walked, asked, there = await _walked_unless_current(client, name, marker, known, last, walking)
    if there is not None:
        write_marker(root, replace(marker, remote=there.path, pushed_ts=time.time()))
        return PushResult(there, len(known), len({h for e in known.values() for h in e[2]}), 0, 0, current=True)
    # New files are sent unhashed, named by the service as it takes them: a first push of 10,000
    # small files, or of one checkpoint, reads each byte once, where hashing first read it twice.
    unhashed: list[int] | None = [] if mf.may_send_unhashed(marker, known) else None
    stamps: dict[str, int] = {}
    manifest = await mf.make(root, chunk_bytes, on_hash, stamps, on_total, known, walked, unhashed)
    digest, packed = mf.digest_and_packed(manifest) if not unhashed else ("", b"")
    there = await _already_there(client, name, digest) if marker.remote and digest not in ("", asked) \
        else None
    if there is not None:
        _remember(root, marker, there, manifest, stamps, chunk_bytes, known, last, digest)
        return PushResult(there, len(manifest.files), len({h for f in manifest.files for h in f.chunks}), 0, 0,
                          current=True)
    presumed = mf.presumed_there(manifest, known) if marker.remote else set()
    out = await _outgoing_of(client, name, manifest, chunk_bytes, presumed, unhashed)
    sending = _Sending(client, root, name, chunk_bytes, client.request_size(request_bytes), on_plan, on_send,
                       bwlimit)
    done = await _send_and_commit(sending, out, walked, commit_timeout_s, ping_s, digest, packed)
    _remember(root, marker, done.info, done.out.manifest, stamps, chunk_bytes, known, last, done.digest)
    return PushResult(done.info, len(done.out.manifest.files), len(done.out.hashes), done.sent_chunks,
                      done.sent_bytes)


async def _walked_unless_current(client: StorageClient, name: str, marker: Marker, known: Index, last: str,
                                 walking: asyncio.Future[Walked]) -> tuple[Walked, str, s.WorkspaceInfo | None]:
    """The walk, the digest asked about ("" if none) and the workspace's info if the walk found
    the tree of the last push and the cluster still holds exactly that. Asked at once, before the
    walk ends: if nothing changed here since the last push, its manifest's digest is the
    question, with no manifest to make (tens of thousands of entries) nor encode, and the service
    checks its files on disk while this side walks its own. The question changes nothing there:
    if the walk found a change, its answer is dropped."""
    asking = asyncio.ensure_future(_already_there(client, name, last)) if last and marker.remote else None
    try:
        walked = await walking
    except BaseException:
        await drop(asking)
        raise
    if asking is None:
        return walked, "", None
    if not unchanged_tree(walked, known):
        await drop(asking)
        return walked, "", None
    return walked, last, await asking


@dataclass(frozen=True)
class _Sending:
    """What every send of one push shares."""

    client: StorageClient
    root: Path
    name: str
    chunk_bytes: int
    request_bytes: int  # within what one message carries
    on_plan: Callable[[int, int], object] | None
    on_send: Progress | None
    bwlimit: int

    async def send(self, out: Outgoing, journal: Journal | None = None) -> tuple[int, transport.Named]:
        """Send what ``out`` lacks; returns the bytes sent and, for the files sent unhashed, path
        -> (the names the service gave their chunks, bytes sent)."""
        if self.on_plan is not None:
            self.on_plan(out.sending, out.bytes)
        return await transport.send(self.client, self.root, self.name, out, self.chunk_bytes, self.request_bytes,
                                    self.on_send, self.bwlimit, journal)


@dataclass(frozen=True)
class _Committed:
    info: s.WorkspaceInfo
    out: Outgoing  # as committed: the files sent unhashed named
    digest: str  # its manifest's
    sent_chunks: int
    sent_bytes: int


async def _send_and_commit(sending: _Sending, out: Outgoing, walked: Walked, commit_timeout_s: float,
                           ping_s: float, digest: str, packed: bytes) -> _Committed:
    """Send what ``out`` lacks and commit its manifest (``digest``, ``packed``: its digest and
    body, if made already: not while files sent unhashed have no names yet)."""
    client, name, chunk_bytes = sending.client, sending.name, sending.chunk_bytes
    journal = Journal(sending.root, walked) if out.unhashed else None
    try:
        sent, named = await sending.send(out, journal)
    finally:
        if journal is not None:
            journal.close()
    lacking = out.sending
    if out.unhashed:
        out = mf.named(out, named, chunk_bytes)
        digest, packed = mf.digest_and_packed(out.manifest)
    try:
        info = await commit(client, name, out.manifest, commit_timeout_s, ping_s, packed)
        return _Committed(info, out, digest, lacking, sent)
    except Conflict:
        # Files on the cluster changed since their push (a job rewrote one, or a service was
        # killed mid-commit), or chunks presumed there are not: the service forgot the changed
        # files, so asking again about every chunk lists what to send.
        out = mf.with_lacking(out, await transport.ask_missing(client, name, out.hashes), chunk_bytes)
        more, _named_too = await sending.send(out)
        info = await commit(client, name, out.manifest, commit_timeout_s, ping_s, packed)
        return _Committed(info, out, digest, lacking + len(out.lacking), sent + more)


async def drop(asked: asyncio.Future | None) -> None:
    """Cancel work whose result is no longer wanted, and wait for it to end (its error, if any,
    is not wanted either; a cancellation of the caller still reaches the caller)."""
    if asked is not None:
        asked.cancel()
        await asyncio.gather(asked, return_exceptions=True)


def _remember(root: Path, marker: Marker, info: s.WorkspaceInfo, manifest: s.Manifest, stamps: dict,
              chunk_bytes: int, known: Index, last: str, digest: str) -> None:
    """Record the push in the workspace's marker, and the local index for the next one's quick
    check with the digest of the manifest pushed (rewritten only if it changed: for 10,000 files
    it is a few MB of JSON); the journal of files sent unhashed is then no longer needed."""
    write_marker(root, replace(marker, remote=info.path, pushed_ts=time.time()))
    files = quick_index(root, manifest, stamps, known)
    if files != known or digest != last:
        PushedIndex(chunk_bytes, files, digest).write(root)
    (root / MARKER_DIR / SENT).unlink(missing_ok=True)


async def commit(client: StorageClient, name: str, manifest: s.Manifest, timeout_s: float,
                 ping_s: float = COMMIT_PING_S, packed: bytes | None = None) -> s.WorkspaceInfo:
    """Commit ``manifest`` (``packed``: its packed body, if made already) and wait for it, asking
    every ``ping_s`` whether the service is still committing: a service that died (no
    responders), hangs (no answer within ``[nats] request_timeout_s``) or restarted (no longer
    committing it) ends the wait with Unavailable within seconds, not ``timeout_s``."""
    if packed is None:
        packed = pack(manifest)
    request: s.CommitRequest | Encoded = encode_packed(s.CommitRequest(workspace=name, manifest=manifest),
                                                       manifest=packed)
    if len(packed) > client.room():  # the manifest goes ahead in pieces, the commit names them
        whole = mf.manifest_head() + packed
        upload = await transport.upload(client, name, whole)
        request = s.CommitRequest(workspace=name, manifest=s.Manifest(), upload=upload,
                                  digest=hashlib.sha256(whole).hexdigest())
    ask = asyncio.ensure_future(client.scall(s.WS_COMMIT, request, timeout_s=timeout_s))
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


async def _commit_alive(client: StorageClient, name: str) -> CommitSeen:
    """Whether the service is still committing ``name`` for us, and if not, what happened to it."""
    try:
        status = await client.scall(s.WS_COMMIT_STATUS, s.WorkspaceRequest(workspace=name))
    except Unavailable as e:
        return CommitSeen.NOT_RUNNING if e.sub is ErrorSub.NO_RESPONDERS else CommitSeen.SILENT
    return CommitSeen.GOING if status.committing else CommitSeen.FORGOTTEN


