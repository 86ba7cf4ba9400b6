"""A run's output on its way to the log file, bounded: the launcher relays the job's stdout and
stderr (one pipe) through :class:`CappedLog` instead of handing the job the file itself.

Why: a job's output is unbounded; written as it comes, a job printing a gigabyte leaves as much on
the node (slow for ``hfai logs`` to read), and could fill the agent's state directory, where the
agent must still write. What is kept of one run's output, at most ``cap`` bytes (``[agent]
log_cap_bytes``): its first quarter as written, then one line saying how many bytes were dropped,
then the latest output (half the cap, less up to 4 KiB to start at a line), so ``hfai logs`` shows
how the run began and how it ended. The file stays live: output reaches it as it comes; once the
run's part outgrows the cap, the tail is moved down behind the head and the file cut short (a
compaction: every byte is copied about twice more).
Earlier runs' output in the same file (one log per job and rank) is never touched.

On a full disk nothing of this fails: output that cannot be written is counted and dropped (the
job never sees an error, and never blocks), and once writing works again a line says how many
bytes were lost. A compaction needs no new space (it overwrites and truncates).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from hfai.agent.logtimes import TimesWriter
from hfai.agent.statefile import disk_full

# Below this a cap leaves no room for a head, a tail and the line between them.
MIN_CAP_BYTES = 64 * 1024
_ALIGN_BYTES = 4096  # how far the kept tail may start later, to start at a line
_COPY_BYTES = 1 << 20


def check_cap(cap: int) -> int:
    """``cap`` if usable ([agent] log_cap_bytes: 0 = no cap), else ValueError saying why."""
    if cap != 0 and cap < MIN_CAP_BYTES:
        raise ValueError(f"[agent] log_cap_bytes must be 0 (no cap) or at least {MIN_CAP_BYTES}, not {cap}")
    return cap


class CappedLog:
    """Appends one run's output to the open log file ``fd`` (opened for reading and writing, not
    O_APPEND: the launcher is its only writer while the run lives), keeping at most ``cap`` bytes
    of it (0: everything)."""

    def __init__(self, fd: int, cap: int, times: TimesWriter | None = None,
                 clock: Callable[[], float] = time.time):
        self.fd = fd
        self.clock = clock  # when output is read (the times' clock: wall time, shown to users)
        self.cap = check_cap(cap)
        self.start = os.fstat(fd).st_size  # this run's output begins here (after the agent's header)
        self.end = self.start
        # When each line was read (hfai.agent.logtimes): ``hfai logs --timestamps``.
        self.times = times
        self.at_line_start = self.start == 0 or self._byte_at(self.start - 1) == b"\n"
        self.head = cap // 4
        self.keep = cap // 2
        self.marker_len = 0  # the "dropped" line's length, once there is one
        self.dropped = 0  # bytes cut out by the cap
        self.lost = 0  # bytes the full disk took, not yet said in the log
        self.lost_total = 0

    def write(self, data: bytes) -> None:
        if self.lost:
            self._say_lost()
        if not self._append(data):
            self.lost += len(data)
            self.lost_total += len(data)
            return
        if self.cap and self.end - self.start > self.cap:
            self._compact()

    def _say_lost(self) -> None:
        note = (f"\n=== hfai: {self.lost} bytes of output lost here: the node's log disk was full ===\n").encode()
        if self._append(note):
            self.lost = 0

    def _append(self, data: bytes) -> bool:
        """Write ``data`` at the end, noting when its lines were read; False if the disk is full
        (what got written stays)."""
        offset = self.end
        written = self._write_end(data)
        n = self.end - offset
        if n:
            if self.times is not None:
                self.times.note(offset, data[:n], self.at_line_start, self.clock())
            self.at_line_start = data[n - 1:n] == b"\n"
        return written

    def _write_end(self, data: bytes) -> bool:
        view = memoryview(data)
        while view:
            try:
                n = os.pwrite(self.fd, view, self.end)
            except OSError as e:
                if disk_full(e):
                    return False
                raise
            self.end += n
            view = view[n:]
        return True

    def _compact(self) -> None:
        """Cut the middle of this run's output: head, the "dropped" line, the last ``keep`` bytes."""
        head_end = self.start + self.head
        body = head_end + self.marker_len  # where the output after the head now starts
        src = self._line_start(self.end - self.keep)
        self.dropped += src - body
        lead = b"" if self._byte_at(head_end - 1) == b"\n" else b"\n"
        marker = (f"{lead.decode()}=== hfai: {self.dropped} bytes of this run's output dropped here: "
                  f"the node keeps {self.cap} bytes of a run's log ([agent] log_cap_bytes), its "
                  f"first {self.head} and its latest ===\n").encode()
        os.pwrite(self.fd, marker, head_end)
        dst = head_end + len(marker)
        kept_from = src
        # Forward copy to a lower offset: every chunk is read before anything overwrites it.
        while src < self.end:
            chunk = os.pread(self.fd, min(_COPY_BYTES, self.end - src), src)
            if not chunk:
                break
            os.pwrite(self.fd, chunk, dst)
            src += len(chunk)
            dst += len(chunk)
        os.ftruncate(self.fd, dst)
        if self.times is not None:
            self.times.compacted(head_end, len(marker), kept_from, self.end, self.clock())
        self.end = dst
        self.marker_len = len(marker)

    def _line_start(self, at: int) -> int:
        """``at``, or just after the first newline within _ALIGN_BYTES of it (a tail that starts
        with a whole line)."""
        nl = os.pread(self.fd, _ALIGN_BYTES, at).find(b"\n")
        return at + nl + 1 if nl >= 0 else at

    def _byte_at(self, offset: int) -> bytes:
        return os.pread(self.fd, 1, offset) if offset >= 0 else b""
