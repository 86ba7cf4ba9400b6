"""Cutting a directory into content-hashed fixed-size chunks: the manifest of a workspace.

Fixed-size chunks: a changed byte changes exactly one chunk of its file (an insertion shifts the
rest of that file, which content-defined chunking would avoid; workspaces are mostly code and
checkpoints rewritten in place, see docs/storage.md).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from hfai.protocol.storage import FileEntry, Manifest
from hfai.storage.ignore import Ignore


def chunk_hash(data: bytes | memoryview) -> str:
    return hashlib.blake2b(data, digest_size=20).hexdigest()


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
            elif stat.S_ISREG(st.st_mode) and not ignore.ignored(rel):
                yield rel, st


def build_manifest(root: Path, chunk_bytes: int, on_bytes=None, known: dict | None = None,
                   stamps: dict | None = None) -> Manifest:
    """Hash every kept file under ``root``; ``on_bytes(n)`` is told of each chunk read (progress).
    ``known``: path -> [size, mtime_ns, chunks] of the last push: a file whose size and mtime are
    unchanged is not read again (rsync's quick check)."""
    ignore = Ignore.load(root)
    files = []
    for rel, st in walk(root, ignore):
        if stamps is not None:
            stamps[rel] = st.st_mtime_ns  # taken before reading: a later change shows as a newer mtime
        seen = (known or {}).get(rel)
        if seen and seen[0] == st.st_size and seen[1] == st.st_mtime_ns and \
                len(seen[2]) == (st.st_size + chunk_bytes - 1) // chunk_bytes:
            files.append(FileEntry(path=rel, size=st.st_size, mode=st.st_mode & 0o777, chunks=tuple(seen[2])))
            if on_bytes is not None:
                on_bytes(st.st_size)
            continue
        hashes, size = [], 0
        # The size is what was read (a file growing meanwhile stays consistent with its chunks).
        for data in file_chunks(root / rel, chunk_bytes):
            hashes.append(chunk_hash(data))
            size += len(data)
            if on_bytes is not None:
                on_bytes(len(data))
        files.append(FileEntry(path=rel, size=size, mode=st.st_mode & 0o777, chunks=tuple(hashes)))
    return Manifest(files=tuple(files), chunk_bytes=chunk_bytes)


def quick_index(root: Path, manifest: Manifest, stamps: dict) -> dict:
    """path -> [size, mtime_ns, chunks] for :func:`build_manifest`'s ``known`` at the next push;
    files whose mtime moved since they were hashed (``stamps``) are left out."""
    out = {}
    for f in manifest.files:
        try:
            st = os.lstat(root / f.path)
        except OSError:
            continue
        if st.st_size == f.size and st.st_mtime_ns == stamps.get(f.path):
            out[f.path] = [f.size, st.st_mtime_ns, list(f.chunks)]
    return out


def read_chunk(root: Path, entry: FileEntry, index: int, chunk_bytes: int) -> bytes:
    with open(root / entry.path, "rb") as f:
        f.seek(index * chunk_bytes)
        return f.read(chunk_bytes)
