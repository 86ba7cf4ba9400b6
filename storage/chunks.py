"""Cutting a directory into content-hashed fixed-size chunks: the manifest of a workspace.

Fixed-size chunks: a changed byte changes exactly one chunk of its file (an insertion shifts the
rest of that file, which content-defined chunking would avoid; workspaces are mostly code and
checkpoints rewritten in place, see docs/storage.md).
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

from hfai.protocol.errors import InvalidRequest
from hfai.protocol.storage import FileEntry, Manifest
from hfai.storage.ignore import Ignore
from hfai.storage.rules import chunk_count


def chunk_hash(data: bytes | memoryview) -> str:
    """A chunk's name: its SHA-256, in hex. SHA-256 rather than BLAKE2b because CPUs hash it in
    hardware (SHA-NI, ARMv8 SHA2): 2.3x BLAKE2b's speed on the machines measured, and both ends
    of a push hash every byte (docs/storage.md)."""
    return hashlib.sha256(data).hexdigest()


def chunk_matches(name: str, data: bytes | memoryview) -> bool:
    """Whether ``data`` is the chunk called ``name``."""
    return chunk_hash(data) == name


def file_chunks(path: Path, chunk_bytes: int) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while True:
            data = f.read(chunk_bytes)
            if not data:
                return
            yield data


def walk(root: Path, ignore: Ignore) -> Iterator[tuple[str, os.stat_result]]:
    """(relative path, stat) of every regular file under ``root`` that ``.hfignore`` keeps, in a
    stable order; links and special files are skipped (a link could point out of the tree)."""
    stack = [""]
    files_too = ignore.has_rules
    while stack:
        rel_dir = stack.pop()
        with os.scandir(root / rel_dir if rel_dir else root) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
            st = e.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                if not ignore.ignored(rel, is_dir=True):
                    stack.append(rel)
            elif stat.S_ISREG(st.st_mode) and not (files_too and ignore.ignored(rel)):
                yield rel, st


#: Threads hashing a push's files (hashlib and file reads release the GIL).
HASH_THREADS = min(4, os.cpu_count() or 1)
#: Chunks one hashing task reads: a large file is hashed by several threads at once.
_TASK_CHUNKS = 64


Walked = list[tuple[str, os.stat_result]]


def scan(root: Path) -> Walked:
    """:func:`walk` of ``root`` with its ``.hfignore``, as a list (blocking)."""
    return list(walk(root, Ignore.load(root)))


def unchanged_tree(walked: Walked, known: dict) -> bool:
    """Whether the walk found exactly the files of the local index (:func:`quick_index`), each
    with the size, mtime, inode and mode it had: then the manifest would be the one last pushed."""
    if len(walked) != len(known):
        return False
    for rel, st in walked:
        seen = known.get(rel)
        if seen is None or len(seen) < 5 or seen[0] != st.st_size or seen[1] != st.st_mtime_ns \
                or seen[3] != st.st_ino or seen[4] != st.st_mode & 0o777:
            return False
    return True


def build_manifest(root: Path, chunk_bytes: int, on_bytes=None, known: dict | None = None,
                   stamps: dict | None = None, threads: int = HASH_THREADS, on_total=None,
                   walked: Walked | None = None, unhashed: list[int] | None = None) -> Manifest:
    """Hash every kept file under ``root`` (in ``threads`` threads); ``on_total(n)`` is told the
    bytes of the files to read, then ``on_bytes(n)`` of the bytes done (progress, from the calling
    thread; files not read again count for neither, so an unchanged tree needs no progress bar).
    ``known``: path -> [size, mtime_ns, chunks, inode] of the last push: a file whose size, mtime
    and inode are unchanged is not read again (rsync's quick check, plus the inode: a file
    replaced by another keeps neither). ``walked``: the tree's :func:`scan`, if done already.
    ``unhashed``: if given (a list), the files that are new since the last push or not at its
    size (:func:`sent_unhashed`) are not read either: their entries have no chunks yet, and their
    places in the manifest's files are appended to the list."""
    from hfai.protocol._lazy import materialize

    # Made now, not filled lazily: a manifest holds one entry per file, tens of thousands, and the
    # dataclass's own __init__ is the fastest way to make them.
    materialize(FileEntry)
    entries: list[tuple[str, os.stat_result, list[str] | None]] = []
    for rel, st in (walked if walked is not None else walk(root, Ignore.load(root))):
        if stamps is not None:
            stamps[rel] = st.st_mtime_ns  # taken before reading: a later change shows as a newer mtime
        seen = (known or {}).get(rel)
        got = _unchanged(seen, st, chunk_bytes)
        if got is None and unhashed is not None and sent_unhashed(seen, st, chunk_bytes):
            unhashed.append(len(entries))
            got = _UNHASHED
        entries.append((rel, st, got))
    if on_total is not None:
        on_total(sum(st.st_size for _rel, st, seen in entries if seen is None))
    hashed = _hash_files(root, [(rel, st.st_size) for rel, st, seen in entries if seen is None], chunk_bytes,
                         on_bytes, threads)
    files = []
    for rel, st, seen in entries:
        if seen is not None:
            files.append(FileEntry(path=rel, size=st.st_size, mode=st.st_mode & 0o777, chunks=tuple(seen)))
        else:
            hashes, size = hashed[rel]
            files.append(FileEntry(path=rel, size=size, mode=st.st_mode & 0o777, chunks=tuple(hashes)))
    return Manifest(files=tuple(files), chunk_bytes=chunk_bytes)


_UNHASHED: list[str] = []  # the chunks of an entry left unhashed, until the service names them


def sent_unhashed(seen: list | None, st: os.stat_result, chunk_bytes: int) -> bool:
    """Whether a changed file is sent without being hashed here, the service naming its chunks as
    it takes them (pure): its content is new, so asking whether the cluster holds it would not
    spare a byte, and reading it once, to send it, is then all of its cost here. That is a file
    the last push did not send (``seen``: its entry in the local index), or a file of one chunk
    it sent at another size. A larger file sent before at another size is hashed: grown by an
    append, or cut short, it keeps most of its chunks. So is a file of the size it had (touched,
    checked out again: maybe unchanged), whose chunks are sent only if the cluster lacks them, and
    a file a killed push began to send unhashed (its journal lists it at its size with no chunks:
    some may be staged already)."""
    if not seen:
        # A larger file with holes (preallocated, sparse) is hashed: its zeros are chunks it
        # repeats, each sent once when named, every time when not.
        return 0 < st.st_size and (st.st_size <= chunk_bytes or st.st_blocks * 512 >= st.st_size)
    return 0 < st.st_size <= chunk_bytes and seen[0] != st.st_size


def _unchanged(seen: list | None, st: os.stat_result, chunk_bytes: int) -> list[str] | None:
    """The chunks the last push recorded for this file, if size, mtime and inode still match."""
    if not seen or len(seen) < 4:
        return None
    size, mtime_ns, chunks, inode = seen[:4]
    if size != st.st_size or mtime_ns != st.st_mtime_ns or inode != st.st_ino:
        return None
    return chunks if len(chunks) == chunk_count(st.st_size, chunk_bytes) else None


_buffers = threading.local()


def _hash_range(path: str, first: int, count: int, chunk_bytes: int) -> tuple[list[str], int]:
    """Hashes of chunks ``first .. first+count-1`` of ``path`` and the bytes read."""
    buf = getattr(_buffers, "buf", None)
    if buf is None or len(buf) != chunk_bytes:
        # Read into one buffer per thread: a new bytes object per chunk costs its pages' first
        # touch, which here took as long as hashing them.
        buf = _buffers.buf = bytearray(chunk_bytes)
    view = memoryview(buf)
    hashes, size = [], 0
    fd = os.open(path, os.O_RDONLY)  # not open(): its buffered reader is a third of a small file's cost
    try:
        at = first * chunk_bytes
        for _ in range(count):
            n = os.preadv(fd, [buf], at)
            if not n:
                break
            hashes.append(chunk_hash(view[:n]))
            size += n
            at += n
            if n < chunk_bytes:
                break
    finally:
        os.close(fd)
    return hashes, size


Task = tuple[str, int, int]  # (path relative to the root, first chunk, chunks to read)


def _hash_batch(root: str, batch: list[Task], chunk_bytes: int) -> list[tuple[list[str], int]]:
    return [_hash_range(os.path.join(root, rel), first, count, chunk_bytes) for rel, first, count in batch]


def _batches(todo: list[tuple[str, int]], chunk_bytes: int) -> list[list[Task]]:
    """The hashing tasks, grouped so that a thread call reads about ``_TASK_CHUNKS`` chunks: a
    large file is split into several (hashed by several threads at once), small files go many to a
    call (a call per file costs more in handing over futures than hashing 100 KB)."""
    batches: list[list[Task]] = []
    cur: list[Task] = []
    weight = 0
    for rel, size in todo:
        n = max(1, (size + chunk_bytes - 1) // chunk_bytes)
        for first in range(0, n, _TASK_CHUNKS):
            last = first + _TASK_CHUNKS >= n
            # The last task of a file reads to its end, however long it has grown since the walk.
            cur.append((rel, first, (1 << 62) if last else _TASK_CHUNKS))
            weight += min(_TASK_CHUNKS, n - first) if size >= chunk_bytes else max(1, size * 4 // chunk_bytes)
            if weight >= _TASK_CHUNKS:
                batches.append(cur)
                cur, weight = [], 0
    if cur:
        batches.append(cur)
    return batches


def _hash_files(root: Path, todo: list[tuple[str, int]], chunk_bytes: int, on_bytes, threads: int) \
        -> dict[str, tuple[list[str], int]]:
    """rel -> (chunk hashes, bytes read) of each file of ``todo`` (rel, size at the walk)."""
    from concurrent.futures import ThreadPoolExecutor

    batches = _batches(todo, chunk_bytes)
    out: dict[str, tuple[list[str], int]] = {}
    base = str(root)  # strings: Path's parsing costs more than hashing a small file
    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        results = pool.map(lambda b: _hash_batch(base, b, chunk_bytes), batches)
        for batch, got in zip(batches, results, strict=True):
            done = 0
            for (rel, _first, count), (hashes, size) in zip(batch, got, strict=True):
                # The size is what was read (a file growing meanwhile stays consistent with its
                # chunks); one shrinking under a task that is not its last would leave a hole.
                if count == _TASK_CHUNKS and size != count * chunk_bytes:
                    raise InvalidRequest(f"{rel} changed while it was hashed; push again")
                prev = out.get(rel)
                out[rel] = (hashes, size) if prev is None else (prev[0] + hashes, prev[1] + size)
                done += size
            if on_bytes is not None:
                on_bytes(done)
    return out


def quick_index(root: Path, manifest: Manifest, stamps: dict, known: dict | None = None) -> dict:
    """path -> [size, mtime_ns, chunks, inode, mode] for :func:`build_manifest`'s ``known`` at the
    next push; files whose mtime moved since they were hashed (``stamps``) are left out. A file
    the walk found as ``known`` has it (not read again, its entry stands as it was: a change since
    the walk shows at the next one), so only the files hashed this time are looked at again."""
    out = {}
    base = str(root)
    known = known or {}
    for f in manifest.files:
        seen = known.get(f.path)
        if seen is not None and len(seen) >= 5 and seen[0] == f.size and seen[1] == stamps.get(f.path) \
                and seen[4] == f.mode and tuple(seen[2]) == f.chunks:
            out[f.path] = seen
            continue
        try:
            st = os.lstat(os.path.join(base, f.path))  # strings: Path's parsing costs 0.1 s per 2,000 files
        except OSError:
            continue
        if st.st_size == f.size and st.st_mtime_ns == stamps.get(f.path):
            out[f.path] = [f.size, st.st_mtime_ns, list(f.chunks), st.st_ino, f.mode]
    return out


def read_chunks(root: Path, wanted: list[tuple[FileEntry, int]], chunk_bytes: int) -> list[bytes]:
    """The bytes of chunk ``index`` of each (entry, index) in ``wanted`` (one thread's batch)."""
    out = []
    for entry, index in wanted:
        with open(root / entry.path, "rb") as f:
            out.append(os.pread(f.fileno(), chunk_bytes, index * chunk_bytes))
    return out


def read_files(root: Path, paths: list[str], chunk_bytes: int) -> list[bytes]:
    """The whole content of each of ``paths``, files of at most one chunk (one thread's batch, for
    :func:`sent_unhashed` files). Raises InvalidRequest for one grown past a chunk since the walk."""
    out = []
    base = str(root)
    for rel in paths:
        fd = os.open(os.path.join(base, rel), os.O_RDONLY)  # not open(): see _hash_range
        try:
            data = os.pread(fd, chunk_bytes + 1, 0)
        finally:
            os.close(fd)
        if len(data) > chunk_bytes:
            raise InvalidRequest(f"{rel} changed while it was pushed; push again")
        out.append(data)
    return out


def read_part(root: Path, entry: FileEntry, first: int, count: int, chunk_bytes: int) -> list[bytes]:
    """Chunks ``first .. first+count-1`` of a :func:`sent_unhashed` file of several chunks, each
    of the length ``entry.size`` (the walk's) gives it. Raises InvalidRequest if the file is not
    of that size any more: its manifest entry, made from the walk, would not match its chunks."""
    out = []
    fd = os.open(os.path.join(str(root), entry.path), os.O_RDONLY)
    try:
        for i in range(first, first + count):
            want = min(chunk_bytes, entry.size - i * chunk_bytes)
            # One byte more than the last chunk's length: a file grown since shows.
            data = os.pread(fd, want + (i == chunk_count(entry.size, chunk_bytes) - 1), i * chunk_bytes)
            if len(data) != want:
                raise InvalidRequest(f"{entry.path} changed while it was pushed; push again")
            out.append(data)
    finally:
        os.close(fd)
    return out


def read_chunk(root: Path, entry: FileEntry, index: int, chunk_bytes: int) -> bytes:
    with open(root / entry.path, "rb") as f:
        f.seek(index * chunk_bytes)
        return f.read(chunk_bytes)
