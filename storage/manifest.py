"""A push's side of the manifest: the tree walked and hashed into one (files unchanged since the
last push not read again, new ones left for the service to name), what of it the cluster lacks
(:class:`Outgoing`), and its digest and packed body, encoded once. Pure but for the walk and the
hashing, which run in threads."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hfai.api.workspace import Marker
from hfai.protocol import encode
from hfai.protocol import storage as s
from hfai.protocol.codec import pack
from hfai.storage import rules
from hfai.storage.chunks import Walked, build_manifest, scan
from hfai.storage.marker import Index

Progress = Callable[[int], object]


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


def start_scan(root: Path) -> asyncio.Future[Walked]:
    """The walk of the workspace at ``root`` (:func:`hfai.storage.chunks.scan`), begun in a thread."""
    return asyncio.ensure_future(asyncio.to_thread(scan, root))


async def make(root: Path, chunk_bytes: int, on_hash: Progress | None, stamps: dict | None,
               on_total: Progress | None, known: Index, walked: Walked | None = None,
               unhashed: list[int] | None = None) -> s.Manifest:
    """:func:`hfai.storage.chunks.build_manifest`, in a thread."""
    return await asyncio.to_thread(build_manifest, root, chunk_bytes, on_hash, known, stamps, on_total=on_total,
                                   walked=walked, unhashed=unhashed)


def may_send_unhashed(marker: Marker, known: Index) -> bool:
    """Whether new files may be sent unhashed: not when this workspace was pushed from here but
    the local index is gone (or was made for other chunks), where the cluster likely holds them."""
    return not (marker.remote and not known)


def indexed(manifest: s.Manifest, unhashed: list[int] | None = None) -> Outgoing:
    """``manifest``'s chunks and where each is, nothing to send yet (``unhashed``: the places of
    the files without chunks yet, sent whole)."""
    where: dict[str, tuple[s.FileEntry, int]] = {}
    for f in manifest.files:
        for i, h in enumerate(f.chunks):
            where.setdefault(h, (f, i))
    return Outgoing(manifest, tuple(where), where, (), {}, tuple(manifest.files[i] for i in unhashed or ()))


def with_lacking(out: Outgoing, lacking: tuple[str, ...], chunk_bytes: int) -> Outgoing:
    """``out`` with ``lacking`` the chunks to send."""
    sizes = {h: min(chunk_bytes, out.where[h][0].size - out.where[h][1] * chunk_bytes) for h in lacking}
    return Outgoing(out.manifest, out.hashes, out.where, lacking, sizes, out.unhashed)


def named(out: Outgoing, names: dict[str, tuple[tuple[str, ...], int]], chunk_bytes: int) -> Outgoing:
    """``out`` once its files sent unhashed are sent: its manifest with the names the service
    gave their chunks (``names``: path -> (names, bytes sent)), those chunks sent (pure)."""
    entries = {f.path: f for f in out.unhashed}
    files = []
    for f in out.manifest.files:
        if f.path in entries:
            hs, n = names[f.path]
            f = s.FileEntry(path=f.path, size=n, mode=f.mode, chunks=hs)
        files.append(f)
    done = indexed(s.Manifest(files=tuple(files), chunk_bytes=out.manifest.chunk_bytes))
    fresh = dict.fromkeys(h for hs, _n in names.values() for h in hs if h not in out.sizes)
    return with_lacking(done, (*out.lacking, *fresh), chunk_bytes)


def presumed_there(manifest: s.Manifest, known: Index) -> set[str]:
    """The chunks of the files the local index says the last push sent exactly so (pure): the
    cluster held them then, so a push asks only about the rest. If one is gone there since (a
    job changed its file, the workspace was removed), the commit says so and the push asks again
    about every chunk (:func:`hfai.storage.push.push`)."""
    out: set[str] = set()
    for f in manifest.files:
        seen = known.get(f.path)
        if seen is not None and len(seen) > 2 and seen[0] == f.size and tuple(seen[2]) == f.chunks:
            out.update(f.chunks)
    return out


@functools.cache
def manifest_head() -> bytes:
    """What encode() writes before a manifest's packed body (the same for every manifest)."""
    empty = s.Manifest()
    whole, body = encode(empty), pack(empty)
    return whole[:len(whole) - len(body)]


def digest_and_packed(manifest: s.Manifest) -> tuple[str, bytes]:
    """The manifest's digest (:func:`rules.manifest_digest`) and its packed body, from one encoding
    (the commit request carries the body as it is: encoding a large manifest twice would cost the
    push as much again)."""
    whole = encode(manifest)
    return rules.digest_bytes(whole), whole[len(manifest_head()):]
