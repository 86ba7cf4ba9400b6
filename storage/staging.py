"""Chunks of pushes in progress, staged as files beside the workspaces until a commit uses them.

Each put request becomes one file (a *pack*) ``<workspace_root>/.hfai-staging/<user>/<id>.pack``:
one header line listing its chunks (``hash:length,...``), then their bytes back to back. A pack is
written under a temporary name and renamed into place, so a pack that exists is whole: a killed
service or client never leaves half a chunk counted, and the index of what is staged is rebuilt
from the directory after a restart (a push interrupted midway resumes; nothing already sent
moves again). The directory is the service's (0700), outside every workspace, so jobs never see
a staged chunk; it lies on the workspaces' filesystem so a commit copies staged bytes into the
new files in the kernel (``copy_file_range``), never through Python.

Why files and not the JetStream object store this used before: a put then cost a JetStream
publish and ack per pack and JetStream's own write, and a commit read every pack back through an
ordered consumer on the service's event loop: two thirds of a push's time (docs/storage.md,
"Where the time goes"). Packs nobody commits are removed after ``staging_ttl_s``.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from hfai.protocol import names
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.storage import ChunkData
from hfai.storage.chunks import chunk_hash, chunk_matches

log = logging.getLogger(__name__)

#: The staging directory's name under the workspace root (not a user name: those are tokens).
DIR_NAME = ".hfai-staging"
_SUFFIX = ".pack"
# A chunk that is a whole file by itself (the put said so), kept as exactly its bytes, so the
# commit makes the workspace's file a hard link to it instead of a copy: `<hash>.<id>.one`.
_WHOLE = ".one"
_TMP = ".tmp"


# The chunks of one file of several chunks, each at its place in that file (the puts said which
# file and where): `<key>.<id>.part`, and `<key>.<id>.part.idx` listing what was written (`offset hash
# length` lines, appended after each write). Once it holds every chunk, the commit links it as that file.
_PART = ".part"
_IDX = ".idx"


def is_whole(path: str) -> bool:
    """Whether the staged file at ``path`` holds one file's bytes at their places and nothing
    else (a chunk staged whole, or a part file): a file the commit may link."""
    return path.endswith(_WHOLE) or path.endswith(_PART)


def is_part(path: str) -> bool:
    return path.endswith(_PART)


@dataclass(frozen=True)
class Located:
    """Where a staged chunk's bytes are: ``length`` bytes at ``offset`` of the file ``path``."""

    path: str
    offset: int
    length: int


def describe(chunks: list[tuple[str, int]]) -> str:
    return ",".join(f"{h}:{n}" for h, n in chunks)


def parse_description(text: str | None) -> list[tuple[str, int]]:
    """The chunks a pack's header lists (pure); garbage gives none."""
    out = []
    for item in (text or "").split(","):
        h, _, n = item.partition(":")
        if h and n.isdigit():
            out.append((h, int(n)))
    return out


def write_pack(directory: Path, chunks: tuple[ChunkData, ...]) -> tuple[str, list[tuple[str, int]]]:
    """Check every chunk against its hash and write them as one pack (blocking: run it in a thread,
    hashlib releases the GIL). Returns (pack path, listing). Raises InvalidRequest, writing
    nothing, for a chunk whose bytes do not match its name."""
    _check(chunks)
    return _write(directory, chunks)


def _check(chunks: tuple[ChunkData, ...]) -> None:
    for c in chunks:
        if not chunk_matches(c.hash, c.data):
            raise InvalidRequest(f"chunk {c.hash[:16]}… does not match its content (changed while pushed?)")


def _write(directory: Path, chunks: tuple[ChunkData, ...]) -> tuple[str, list[tuple[str, int]]]:
    listing = [(c.hash, len(c.data)) for c in chunks]
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = directory / f"{uuid.uuid4().hex}{_SUFFIX}"
    tmp = final.with_name(final.name + _TMP)
    with open(tmp, "wb") as out:
        out.write(describe(listing).encode() + b"\n")
        for c in chunks:
            out.write(c.data)
    os.replace(tmp, final)
    return str(final), listing


def remove_packs(paths: list[str]) -> None:
    """Unlink packs (blocking: freeing a pack's pages takes time in proportion to its size, so the
    service does it in a thread after its reply)."""
    for p in paths:
        Path(p).unlink(missing_ok=True)
        if is_part(p):
            Path(p + _IDX).unlink(missing_ok=True)


#: What a put staged: (path, [(hash, offset in that file, length)]).
Staged = tuple[str, list[tuple[str, int, int]]]


def stage_put(directory: Path, chunks: tuple[ChunkData, ...], whole: frozenset[str] = frozenset(),
              part: str = "", first: int = 0, chunk_bytes: int = 0) -> tuple[list[Staged], tuple[str, ...]]:
    """:func:`write_put`, for a put that may carry chunks with no name (``hash`` empty), of a file
    the client did not hash (PutRequest): each such chunk is named here by its hash and staged as
    a file of its own, or with ``part`` at its place in that file's part file. Also returns every
    chunk's name, in order, if some had none (else nothing)."""
    if all(c.hash for c in chunks):
        return write_put(directory, chunks, whole, part, first, chunk_bytes), ()
    _check(tuple(c for c in chunks if c.hash))
    named = tuple(c if c.hash else ChunkData(hash=chunk_hash(c.data), data=c.data) for c in chunks)
    if not part:
        whole = whole | {n.hash for c, n in zip(chunks, named, strict=True) if not c.hash}
    return _stage(directory, named, whole, part, first, chunk_bytes), tuple(c.hash for c in named)


def write_put(directory: Path, chunks: tuple[ChunkData, ...], whole: frozenset[str] = frozenset(),
              part: str = "", first: int = 0, chunk_bytes: int = 0) -> list[Staged]:
    """A put's chunks staged (blocking, checked as :func:`write_pack` does). With ``part`` (the
    part file :meth:`Staging.part_path` chose for the file they belong to) they are that file's
    chunks ``first``, ``first + 1``, …, written at their places there; else those named in
    ``whole`` each as a file of its own bytes and the rest as one pack."""
    _check(chunks)
    return _stage(directory, chunks, whole, part, first, chunk_bytes)


def _stage(directory: Path, chunks: tuple[ChunkData, ...], whole: frozenset[str] = frozenset(),
           part: str = "", first: int = 0, chunk_bytes: int = 0) -> list[Staged]:
    if part and chunk_bytes > 0 and chunks:
        return [_write_part(part, first, chunks, chunk_bytes)]
    out: list[Staged] = []
    rest = []
    done: set[str] = set()
    for c in chunks:
        if c.hash not in whole:
            rest.append(c)
        elif c.hash not in done:
            done.add(c.hash)
            out.append((_write_whole(directory, c), [(c.hash, 0, len(c.data))]))
    if rest:
        path, listing = _write(directory, tuple(rest))
        at = len(describe(listing).encode()) + 1
        placed = []
        for h, n in listing:
            placed.append((h, at, n))
            at += n
        out.append((path, placed))
    return out


def _write_part(path: str, first: int, chunks: tuple[ChunkData, ...], chunk_bytes: int) -> Staged:
    fd = _create(path, os.O_WRONLY | os.O_CREAT)
    if os.fstat(fd).st_nlink != 1:
        # A commit linked it into a workspace a moment ago (its removal is on the way) and a job
        # may write to it there: the rest of this file starts a part file of its own.
        os.close(fd)
        path = _unique_part(path)
        fd = _create(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    placed = []
    try:
        for i, c in enumerate(chunks):
            start = (first + i) * chunk_bytes
            _write_all(fd, c.data, start)
            placed.append((c.hash, start, len(c.data)))
    finally:
        os.close(fd)
    # Listed only once written: what the list names is in the file (a restart trusts it, as it
    # trusts a pack whose size adds up). One append of whole lines: puts of one file may run at once.
    lines = "".join(f"{at} {h} {n}\n" for h, at, n in placed).encode()
    idx = os.open(path + _IDX, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(idx, lines)
    finally:
        os.close(idx)
    return path, placed


def _unique_part(near: str) -> str:
    """A new part file's path in the directory of ``near``, for the file of key ``<key>``."""
    d, _, name = near.rpartition("/")
    return f"{d}/{name.partition('.')[0]}.{uuid.uuid4().hex[:12]}{_PART}"


def _write_whole(directory: Path, c: ChunkData) -> str:
    # Under a subdirectory by the hash's first two digits: tens of thousands of small files
    # created at once by the service's threads would otherwise all wait on one directory's lock.
    # The length is in the name, so a file cut short by a kill is told apart at a restart without
    # a temporary name and a rename (which would take that lock again).
    # A string, and 6 random bytes for the name: a Path and a UUID per file were a tenth of the
    # Python time of staging 10,000 small files.
    final = f"{directory}/{c.hash[:2]}/{c.hash}.{len(c.data)}.{os.urandom(6).hex()}{_WHOLE}"
    fd = _create(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        _write_all(fd, c.data, 0)
    finally:
        os.close(fd)
    return final


def _create(path: str, flags: int) -> int:
    """``os.open(path, flags)``, making its directory (the service's, 0700) the first time."""
    try:
        return os.open(path, flags, 0o600)
    except FileNotFoundError:
        Path(path).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        return os.open(path, flags, 0o600)


def _write_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        view = view[os.pwrite(fd, view, at + len(data) - len(view)):]


class Staging:
    """The index of staged chunks (per user) over the pack files in ``root``. Its methods run on
    the service's event loop; :func:`write_pack` and :meth:`locate` may run in threads."""

    def __init__(self, root: str | os.PathLike, ttl_s: float):
        self.root = Path(root)
        self.ttl_s = ttl_s
        self._index: dict[str, dict[str, Located]] = {}  # user -> hash -> where
        self._packs: dict[str, tuple[str, list[str]]] = {}  # pack path -> (user, its hashes)
        self._parts: dict[tuple[str, str], str] = {}  # (user, file key) -> its part file now

    @classmethod
    def open(cls, workspace_root: str | os.PathLike, ttl_s: float) -> Staging:
        """The staging area under ``workspace_root``, its index rebuilt from the packs there
        (blocking). Leftover temporary files and packs older than ``ttl_s`` are removed."""
        staging = cls(Path(workspace_root) / DIR_NAME, ttl_s)
        staging.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(staging.root, 0o700)
        staging._rebuild(time.time())
        return staging

    def _rebuild(self, now: float) -> None:
        for user_dir in sorted(p for p in self.root.iterdir() if p.is_dir() and names.is_token(p.name)):
            for p in user_dir.iterdir():
                if p.name.endswith(_TMP):
                    p.unlink(missing_ok=True)
                elif p.name.endswith(_SUFFIX):
                    self._load(user_dir.name, p, now)
                elif len(p.name) == 2 and p.is_dir():
                    for q in p.iterdir():
                        if q.name.endswith(_WHOLE):
                            self._load_whole(user_dir.name, q, now)
                        elif q.name.endswith(_PART):
                            self._load_part(user_dir.name, q, now)
                        elif q.name.endswith(_PART + _IDX) and not q.with_suffix("").exists():
                            q.unlink(missing_ok=True)
        log.info("staging: %d pack(s) of unfinished pushes", len(self._packs))

    def _load(self, user: str, pack: Path, now: float) -> None:
        try:
            st = pack.stat()
            with open(pack, "rb") as f:
                header = f.readline()
        except OSError:
            return
        listing = parse_description(header.decode(errors="replace").strip())
        # A pack is renamed into place whole; a size that does not add up is a damaged file.
        if now - st.st_mtime > self.ttl_s or not listing or st.st_size != len(header) + sum(n for _, n in listing):
            pack.unlink(missing_ok=True)
            return
        self._add(user, str(pack), len(header), listing)

    def _load_whole(self, user: str, path: Path, now: float) -> None:
        try:
            st = path.stat()
        except OSError:
            return
        h, _, rest = path.name.partition(".")
        length = rest.partition(".")[0]
        # Cut short by a kill (its length is in its name), or linked into a workspace already (a
        # commit finished, its release did not): not staged.
        if now - st.st_mtime > self.ttl_s or st.st_nlink != 1 or not length.isdigit() or st.st_size != int(length):
            path.unlink(missing_ok=True)
            return
        self._add(user, str(path), 0, [(h, st.st_size)])

    def _load_part(self, user: str, path: Path, now: float) -> None:
        idx = Path(str(path) + _IDX)
        try:
            st = path.stat()
            text = idx.read_text(errors="replace")
        except OSError:
            text, st = "", None
        placed = []
        for line in text.splitlines():
            words = line.split()
            if len(words) == 3 and words[0].isdigit() and words[2].isdigit():
                placed.append((words[1], int(words[0]), int(words[2])))  # hash, offset, length
        if st is None or now - st.st_mtime > self.ttl_s or st.st_nlink != 1 or not placed:
            remove_packs([str(path)])
            return
        self._add_at(user, str(path), [(h, at, n) for h, at, n in placed if at + n <= st.st_size])
        self._parts.setdefault((user, path.name.partition(".")[0]), str(path))

    def _add(self, user: str, pack: str, offset: int, listing: list[tuple[str, int]]) -> None:
        placed = []
        for h, n in listing:
            placed.append((h, offset, n))
            offset += n
        self._add_at(user, pack, placed)

    def _add_at(self, user: str, path: str, placed: list[tuple[str, int, int]]) -> None:
        where = self._index.setdefault(user, {})
        for h, at, n in placed:
            where.setdefault(h, Located(path, at, n))
        had = self._packs.get(path)
        self._packs[path] = (user, [*(had[1] if had else ()), *(h for h, _at, _n in placed)])

    def user_dir(self, user: str) -> Path:
        return self.root / names.check_token("user name", user)

    def held(self, user: str) -> set[str]:
        return set(self._index.get(user, {}))

    def staged(self, user: str, written: Staged) -> None:
        """Record what :func:`write_put` wrote for ``user``."""
        self._add_at(user, written[0], written[1])
        if is_part(written[0]):
            self._parts[(user, Path(written[0]).name.partition(".")[0])] = written[0]

    def part_path(self, user: str, key: str) -> str:
        """The part file the chunks of the file of ``key`` (PutRequest.file) go to: the one that
        already holds some of them (a resumed push), else a new one. Each commit's part file is
        its own, so removing a used one never takes a newer push's chunks with it."""
        names.check_token("file key", key)
        path = self._parts.get((user, key))
        if path is None:  # chosen at once: the file's other puts, already on their way, go there too
            path = self._parts[(user, key)] = _unique_part(str(self.user_dir(user) / key[:2] / key))
        return path

    def added(self, user: str, pack: str, listing: list[tuple[str, int]]) -> None:
        """Record a pack :func:`write_pack` wrote for ``user``."""
        self._add(user, pack, len(describe(listing).encode()) + 1, listing)

    def locate(self, user: str, h: str) -> Located | None:
        return self._index.get(user, {}).get(h)

    def read(self, user: str, h: str) -> bytes:
        """A staged chunk's bytes; KeyError if none is staged (or its pack vanished)."""
        where = self.locate(user, h)
        if where is None:
            raise KeyError(h)
        try:
            with open(where.path, "rb") as f:
                return os.pread(f.fileno(), where.length, where.offset)
        except FileNotFoundError:
            raise KeyError(h) from None

    def release(self, user: str, used: set[str]) -> int:
        """Delete the packs of ``user`` whose every chunk is in ``used`` (now written to disk);
        returns how many."""
        done = self.forget(user, used)
        remove_packs(done)
        return len(done)

    def forget(self, user: str, used: set[str]) -> list[str]:
        """Drop from the index the packs of ``user`` whose every chunk is in ``used`` and return
        their paths, for :func:`remove_packs` (a pack left on disk is indexed again at a restart
        and expires: nothing is lost if its removal never happens)."""
        done = [p for p, (u, hs) in self._packs.items() if u == user and set(hs) <= used]
        for pack in done:
            self._drop(user, pack)
        return done

    def _drop(self, user: str, pack: str) -> None:
        where = self._index.get(user, {})
        for h in self._packs.pop(pack)[1]:
            if h in where and where[h].path == pack:
                del where[h]
        if is_part(pack):
            key = (user, Path(pack).name.partition(".")[0])
            if self._parts.get(key) == pack:
                del self._parts[key]

    def expire(self, now: float) -> int:
        """Remove packs older than ``ttl_s`` (pushes nobody committed); returns how many."""
        old = []
        for pack, (user, _hs) in self._packs.items():
            try:
                if now - os.stat(pack).st_mtime > self.ttl_s:
                    old.append((pack, user))
            except FileNotFoundError:
                old.append((pack, user))
        for pack, user in old:
            remove_packs([pack])
            self._drop(user, pack)
        return len(old)
