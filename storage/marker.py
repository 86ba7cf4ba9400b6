"""What a push records in the workspace's ``.hfai`` folder beside the marker
(:mod:`hfai.api.workspace`), as typed records with explicit reads and writes:

- :class:`PushedIndex` (``.hfai/pushed.json``): the local index of the last push (each file's
  size, mtime, chunks, inode and mode, for the next push's quick check) and its manifest's digest;
- :class:`JournalEntry` (``.hfai/sent.jsonl``, one JSON array a line, appended by
  :class:`Journal`): the files a push in progress sent unhashed, with the names the service gave
  them, so that a killed push's next one sends them no more.

Both formats carry no version: a record that does not read as one is a cache missed (the next
push hashes those files again), said once in the log with what was wrong, never a failed push.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from hfai._atomic import write_atomic
from hfai.api.workspace import MARKER_DIR, Marker, find_root, json_object, read_marker, write_marker
from hfai.protocol import storage as s
from hfai.storage import rules
from hfai.storage.chunks import Walked

log = logging.getLogger(__name__)

QUICK = "pushed.json"  # size, mtime and chunks of each file at the last push (PushedIndex)
SENT = "sent.jsonl"  # files sent unhashed by a push not yet committed (Journal)

#: path -> [size, mtime_ns, chunks, inode, mode]: the local index's entry of each file, as
#: :mod:`hfai.storage.chunks` reads it (a list, not a record: tens of thousands of them are read
#: at every push, and JSON's arrays are their on-disk form).
Index = dict[str, list]


class RecordError(ValueError):
    """A file of ``.hfai`` that does not read as its record; the message names the file and what
    is wrong with it."""


@dataclass(frozen=True)
class PushedIndex:
    """``.hfai/pushed.json``: the local index of the last push, for chunks of ``chunk_bytes``, and
    the digest of the manifest it pushed ("" if none)."""

    chunk_bytes: int
    files: Index = field(default_factory=dict)
    digest: str = ""

    @staticmethod
    def path(root: Path) -> Path:
        return root / MARKER_DIR / QUICK

    @classmethod
    def read(cls, root: Path) -> PushedIndex | None:
        """The record, or None if there is none; RecordError if it is not one."""
        where = cls.path(root)
        try:
            text = where.read_text()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise RecordError(f"{where}: unreadable ({e})") from None
        return cls.parse(text, where)

    @classmethod
    def parse(cls, text: str, where: Path | str = QUICK) -> PushedIndex:
        try:
            data = json_object(text, where)
        except ValueError as e:
            raise RecordError(str(e)) from None
        chunk_bytes, files, digest = data.get("chunk_bytes"), data.get("files", {}), data.get("digest", "")
        if not isinstance(chunk_bytes, int) or isinstance(chunk_bytes, bool) or chunk_bytes <= 0:
            raise RecordError(f"{where}: chunk_bytes is {chunk_bytes!r}, not a positive integer")
        if not isinstance(files, dict):
            raise RecordError(f"{where}: files is a {type(files).__name__}, not an object")
        if not isinstance(digest, str):
            raise RecordError(f"{where}: digest is a {type(digest).__name__}, not a string")
        return cls(chunk_bytes, files, digest)

    def write(self, root: Path) -> None:
        write_atomic(self.path(root), json.dumps({"chunk_bytes": self.chunk_bytes, "files": self.files,
                                                  "digest": self.digest}))


@dataclass(frozen=True)
class JournalEntry:
    """One line of ``.hfai/sent.jsonl``: a file sent unhashed (or begun: no ``chunks`` yet), with
    the size sent and the mtime and inode the walk saw before it was read (a change since shows
    at the next push's quick check)."""

    path: str
    size: int
    mtime_ns: int
    chunks: tuple[str, ...]
    inode: int
    mode: int

    def line(self) -> str:
        return json.dumps([self.path, self.size, self.mtime_ns, list(self.chunks), self.inode, self.mode],
                          separators=(",", ":")) + "\n"

    @classmethod
    def parse(cls, line: str) -> JournalEntry:
        try:
            item = json.loads(line)
        except ValueError as e:
            raise RecordError(f"{SENT}: a line that is not JSON ({e})") from None
        if not (isinstance(item, list) and len(item) == 6 and isinstance(item[0], str)
                and all(isinstance(v, int) for v in (item[1], item[2], item[4], item[5]))
                and isinstance(item[3], list) and all(isinstance(h, str) for h in item[3])):
            raise RecordError(f"{SENT}: {line[:80]!r} is not [path, size, mtime_ns, [chunks], inode, mode]")
        return cls(item[0], item[1], item[2], tuple(item[3]), item[4], item[5])

    def index_entry(self) -> list:
        """This file's entry in the local index (:data:`Index`)."""
        return [self.size, self.mtime_ns, list(self.chunks), self.inode, self.mode]


def read_journal(root: Path) -> list[JournalEntry]:
    """The entries of a push that did not finish ([] if none). A line that does not read (the
    last one cut short by a full disk or a kill) is skipped: its file is sent again."""
    try:
        text = (root / MARKER_DIR / SENT).read_text()
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        log.warning("ignoring %s (%s): the files it lists are sent again", root / MARKER_DIR / SENT, e)
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(JournalEntry.parse(line))
        except RecordError as e:
            log.info("%s; its file is sent again", e)
    return out


class Journal:
    """The files a push sends unhashed, appended to ``.hfai/sent.jsonl`` as each put is answered:
    a push killed midway leaves them staged on the cluster, and the next one reads them with the
    local index (:func:`read_known`), so it neither reads nor sends them again. A file of several
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
            st = self.stats[f.path]  # as the walk saw it, before it was read
            lines.append(JournalEntry(f.path, n, st.st_mtime_ns, tuple(hs), st.st_ino, f.mode).line())
        if self._fd is None:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.write(self._fd, "".join(lines).encode())  # whole lines in one write: a kill leaves no half line

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def read_quick(root: Path, chunk_bytes: int) -> tuple[Index, str]:
    """The local index and the digest of the manifest last pushed ("" if none), for chunks of
    ``chunk_bytes`` (an index made for other chunks is none)."""
    try:
        pushed = PushedIndex.read(root)
    except RecordError as e:
        log.warning("%s; every file is hashed again", e)
        return {}, ""
    if pushed is None or pushed.chunk_bytes != chunk_bytes:
        return {}, ""
    return pushed.files, pushed.digest


def read_known(root: Path, chunk_bytes: int) -> tuple[Index, str]:
    """:func:`read_quick`, with what the journal of a push that did not finish adds: its files
    are staged on the cluster, and the last push's digest no longer tells an unchanged tree."""
    known, last = read_quick(root, chunk_bytes)
    added = {e.path: e.index_entry() for e in read_journal(root)}
    return ({**known, **added}, "") if added else (known, last)


def forget_push(root: Path) -> None:
    """Drop what the last push recorded here (the local index, a journal): the next push then
    presumes nothing of it on the cluster."""
    (root / MARKER_DIR / QUICK).unlink(missing_ok=True)
    (root / MARKER_DIR / SENT).unlink(missing_ok=True)


def init(root: Path, name: str | None) -> Marker:
    """Make ``root`` workspace ``name`` (default: the directory's name)."""
    name = rules.check_workspace_name(name or root.resolve().name)
    old = read_marker(root) if find_root(root) == root else None
    if old is not None and old.name == name:
        marker = old
    else:
        # Another workspace now: what the last push recorded (where it went, the local index of
        # what it sent) is the old one's, and the next push must not presume any of it there.
        marker = Marker(name=name)
        forget_push(root)
    write_marker(root, marker)
    return marker
