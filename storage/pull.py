"""A pull: the cluster's copy of a workspace written into a local directory, its manifest read
in slices and its chunks fetched across files, as many a request as fit one message."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from hfai.protocol import decode
from hfai.protocol import storage as s
from hfai.protocol.errors import NotFound, Unavailable
from hfai.storage import rules
from hfai.storage.chunks import chunk_matches, file_chunks
from hfai.storage.client import CHUNK_COST, StorageClient, typed_errors
from hfai.storage.manifest import Progress


async def pull(client: StorageClient, name: str, dest: Path, request_bytes: int,
               on_bytes: Progress | None = None) -> int:
    """Write the cluster's copy of workspace ``name`` into ``dest``; returns the files written.
    Files already there with the right content are left alone. Chunks are fetched across files,
    as many a request as fit (a tree of many small files is not a request a file)."""
    with typed_errors("pull", "write", "once there is room and permission"):
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
            got = await client.scall(s.WS_FETCH, s.FetchRequest(
                workspace=name, hashes=tuple(dict.fromkeys(h for _f, _i, h in batch))))
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
    for _ in range(tries):
        first = await client.scall(s.WS_MANIFEST_SLICE,
                                   s.ManifestSliceRequest(workspace=name, limit=client.room()))
        parts, got = [first.data], len(first.data)
        while got < first.total:
            more = await client.scall(s.WS_MANIFEST_SLICE, s.ManifestSliceRequest(
                workspace=name, offset=got, limit=client.room()))
            if more.digest != first.digest or not more.data:
                break
            parts.append(more.data)
            got += len(more.data)
        whole = b"".join(parts)
        if hashlib.sha256(whole).hexdigest() == first.digest:
            return decode(whole, s.Manifest, max_bytes=s.MAX_MANIFEST_BYTES)
    raise Unavailable(f"workspace {name!r} kept changing while its manifest was read; pull again")


def _holds(path: Path, chunks: tuple[str, ...], chunk_bytes: int) -> bool:
    """Whether the file at ``path`` is exactly these chunks."""
    n = 0
    for data in file_chunks(path, chunk_bytes):  # one chunk in memory at a time
        if n >= len(chunks) or not chunk_matches(chunks[n], data):
            return False
        n += 1
    return n == len(chunks)
