"""When each line of a job's log was read from the job's output: ``rank<r>.log.times`` next to the
log, so that ``hfai logs --timestamps`` stamps a line with the time the node got it, not the time
someone reads it (every line of a finished job's log then had the same time).

Layout: records of 16 bytes, little-endian ``<Qd``: a byte offset in the log and a Unix time. A
record says that the line starting at that offset, and every line after it up to the next record,
was read at that time. Records are in offset order. The launcher appends one (:class:`TimesWriter`)
whenever output it relays starts a line, at most one per :data:`RESOLUTION_S`: a job printing a
line per millisecond adds 16 KB a second at most, and :class:`~hfai.agent.logcap.CappedLog`'s
compaction drops the records of the output it drops. The agent reads them back with the log
(:func:`line_times`). A line that starts before the first record (an agent's header ahead of a
job's first output) gets the first record's time; the lines an agent writes between two runs get
the time of the last output before them.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator

from hfai.agent.statefile import disk_full

RECORD = struct.Struct("<Qd")
#: Lines read within this long of the last record share its time (the stamps show milliseconds).
RESOLUTION_S = 0.001
#: Most lines one answer stamps (its times must fit one NATS message with the data).
MAX_STAMPED_LINES = 16384
_READ_RECORDS = 4096


def times_path(log_path: str | os.PathLike) -> str:
    return os.fspath(log_path) + ".times"


class TimesWriter:
    """Appends the records of one run's output to the open times file ``fd`` (opened for reading
    and writing: a compaction rewrites this run's part). Never raises for a full disk: a record
    that cannot be written is dropped, and its lines get the time of the record before."""

    def __init__(self, fd: int):
        self.fd = fd
        self.size = os.fstat(fd).st_size // RECORD.size * RECORD.size  # a torn last record is overwritten
        self.run_start = self.size  # earlier runs' records end here and are never touched
        self.last_ts = -math.inf

    def note(self, offset: int, data: bytes, at_line_start: bool, ts: float) -> None:
        """``data`` was appended to the log at ``offset`` at time ``ts``; ``at_line_start``: the
        byte before ``offset`` ends a line (or there is none)."""
        if at_line_start:
            first = offset
        else:
            nl = data.find(b"\n", 0, len(data) - 1)
            if nl < 0:
                return  # only the rest of a line already stamped
            first = offset + nl + 1
        if ts - self.last_ts < RESOLUTION_S:
            return
        if self._write(RECORD.pack(first, ts), self.size):
            self.size += RECORD.size
            self.last_ts = ts

    def compacted(self, cut: int, marker_len: int, kept_from: int, end: int, ts: float) -> None:
        """The log's bytes [cut, kept_from) were replaced by a line of ``marker_len`` bytes (read
        at ``ts``) and [kept_from, end) moved down to follow it: drop this run's records of the
        dropped bytes and move those of the kept ones with them."""
        records = list(self._records(self.run_start, self.size))
        head = [r for r in records if r[0] < cut]
        covering = [r for r in records if r[0] <= kept_from]
        shift = kept_from - (cut + marker_len)
        tail = [(kept_from - shift, covering[-1][1])] if covering and covering[-1][0] < kept_from else []
        tail += [(off - shift, t) for off, t in records if kept_from <= off < end]
        out = b"".join(RECORD.pack(off, t) for off, t in [*head, (cut, ts), *tail])
        if self._write(out, self.run_start):
            self.size = self.run_start + len(out)
            try:
                os.ftruncate(self.fd, self.size)
            except OSError:
                pass

    def _records(self, start: int, end: int) -> Iterator[tuple[int, float]]:
        while start < end:
            chunk = os.pread(self.fd, min(_READ_RECORDS * RECORD.size, end - start), start)
            if not chunk:
                return
            yield from RECORD.iter_unpack(chunk[: len(chunk) // RECORD.size * RECORD.size])
            start += len(chunk)

    def _write(self, data: bytes, at: int) -> bool:
        try:
            view = memoryview(data)
            while view:
                n = os.pwrite(self.fd, view, at)
                at += n
                view = view[n:]
        except OSError as e:
            if disk_full(e):
                return False
            raise
        return True


def line_starts(data: bytes, at_line_start: bool) -> list[int]:
    """Where the lines that start in ``data`` start (pure); ``at_line_start``: ``data[0]`` starts
    one (it is the log's first byte, or the byte before it ends a line)."""
    starts = [0] if at_line_start and data else []
    i = data.find(b"\n")
    while 0 <= i < len(data) - 1:
        starts.append(i + 1)
        i = data.find(b"\n", i + 1)
    return starts


def stamp_lines(records: list[tuple[int, float]], offsets: list[int]) -> tuple[float, ...]:
    """The time of the line starting at each of ``offsets`` (ascending) by ``records`` (pure): the
    last record at or before it, else the first record; 0.0 where there is no record at all."""
    if not records:
        return tuple(0.0 for _ in offsets)
    out, i = [], 0
    for off in offsets:
        while i + 1 < len(records) and records[i + 1][0] <= off:
            i += 1
        out.append(records[i][1])
    return tuple(out)


def line_times(fd: int | None, offset: int, data: bytes, at_line_start: bool) -> tuple[bytes, tuple[float, ...]]:
    """``data`` (read from the log at ``offset``; cut after :data:`MAX_STAMPED_LINES` lines) and
    the time each line starting in it was read, from the open times file ``fd`` (None: there is
    none, as when it could not be created: every time 0.0)."""
    starts = line_starts(data, at_line_start)
    if len(starts) > MAX_STAMPED_LINES:
        data = data[: starts[MAX_STAMPED_LINES]]
        starts = starts[:MAX_STAMPED_LINES]
    if fd is None or not starts:
        return data, tuple(0.0 for _ in starts)
    size = os.fstat(fd).st_size // RECORD.size
    first, last = offset + starts[0], offset + starts[-1]
    # The last record at or before the first line (binary search), then those up to the last line.
    lo, hi = 0, size
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if RECORD.unpack(os.pread(fd, RECORD.size, mid * RECORD.size))[0] <= first:
            lo = mid
        else:
            hi = mid
    records: list[tuple[int, float]] = []
    at = lo * RECORD.size
    while at < size * RECORD.size:
        chunk = os.pread(fd, min(_READ_RECORDS * RECORD.size, size * RECORD.size - at), at)
        if not chunk:
            break
        batch = list(RECORD.iter_unpack(chunk[: len(chunk) // RECORD.size * RECORD.size]))
        records.extend(batch)
        at += len(chunk)
        if batch and batch[-1][0] > last:
            break
    return data, stamp_lines(records, [offset + s for s in starts])
