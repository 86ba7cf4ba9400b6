"""The read paths behind :meth:`hfai.data.FileReader.read`.

A batch is planned as :class:`Span` lists (one sample: where it lies in the file, where it goes
in the batch buffer, which CRC it must have) and then filled by one of:

- :func:`copy_mapped`: copy from the file's memory map on the calling thread. Fastest when the
  pages are cached, but every uncached page would block it.
  :func:`gather_rows` does the same for fixed-size samples with one numpy gather.
- :class:`ThreadedReads`: positioned reads (``os.preadv``, which releases the GIL) on a pool of
  threads, so many reads are in flight at once: the fast path for a cold cache. Each thread
  checks the CRCs of what it read while the others wait on the disk, so checksums stay off the
  critical path. With ``direct=True`` it reads through ``O_DIRECT`` (no page cache) into aligned
  bounce buffers.

Each fill returns the first bad sample as ``(batch position, actual CRC)`` or None; the caller
turns that into a :class:`~hfai.data.errors.ChecksumError`.
"""

from __future__ import annotations

import mmap
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import numpy as np

from hfai.data.checksum import crc32
from hfai.data.errors import FormatError
from hfai.data.recordfile import RecordFile, pread_exact

_ALIGN = 4096  # O_DIRECT needs offsets, lengths and buffers aligned to the logical block size


class Span(NamedTuple):
    position: int  # index of the sample in the batch (for error reports)
    start: int  # absolute offset in the file
    end: int
    dest: int  # offset in the batch buffer
    crc: int  # expected CRC-32


Bad = tuple[int, int]  # (batch position, actual CRC)


def copy_mapped(file: RecordFile, spans: list[Span], out: memoryview, check: bool) -> Bad | None:
    """Copy ``spans`` from the file's memory map into ``out`` on this thread."""
    source = memoryview(file.mapping())
    try:
        for position, start, end, dest, expected in spans:
            chunk = source[start:end]
            out[dest : dest + end - start] = chunk
            if check:
                actual = crc32(chunk)
                if actual != expected:
                    return position, actual
        return None
    finally:
        source.release()  # a live export would stop RecordFile.close() from unmapping


def gather_rows(
    file: RecordFile, local: np.ndarray, out: np.ndarray, positions: np.ndarray | None = None
) -> None:
    """Copy whole samples of a file whose samples all have length ``out.shape[1]``.

    The file's data region is viewed as an ``(n, L)`` array over the memory map and the batch
    gathered with one numpy call (into ``out``, or into its rows ``positions``).
    """
    h = file.header
    length = out.shape[1]
    rows = np.frombuffer(file.mapping(), dtype=np.uint8, count=h.n * length, offset=int(h.offsets[0]))
    try:
        if positions is None:
            np.take(rows.reshape(h.n, length), local, axis=0, out=out)
        else:
            out[positions] = rows.reshape(h.n, length)[local]
    finally:
        del rows  # a live view of the map would stop RecordFile.close() from unmapping


def check_rows(rows: np.ndarray, expected: np.ndarray) -> Bad | None:
    """CRC of each row against ``expected``; the first mismatch or None."""
    actual = np.fromiter(map(crc32, rows), dtype=np.uint32, count=len(rows))
    bad = np.flatnonzero(actual != expected)
    return (int(bad[0]), int(actual[bad[0]])) if bad.size else None


def pread_spans(file: RecordFile, spans: list[Span], out: memoryview, check: bool) -> Bad | None:
    """Read ``spans`` with positioned reads through the page cache."""
    fd = file.fd
    for position, start, end, dest, expected in spans:
        view = out[dest : dest + end - start]
        pread_exact(fd, view, start, file.path)
        if check:
            actual = crc32(view)
            if actual != expected:
                return position, actual
    return None


_bounce = threading.local()


def _bounce_buffer(size: int) -> memoryview:
    """A page-aligned buffer of at least ``size`` bytes, one per thread (mmap memory is aligned)."""
    buf = getattr(_bounce, "buf", None)
    if buf is None or len(buf) < size:
        buf = mmap.mmap(-1, max(size, 1 << 20))
        _bounce.buf = buf
    return memoryview(buf)


def pread_spans_direct(file: RecordFile, spans: list[Span], out: memoryview, check: bool) -> Bad | None:
    """Read ``spans`` through ``O_DIRECT``: aligned reads into a bounce buffer, then a copy."""
    fd = file.direct_fd()
    for position, start, end, dest, expected in spans:
        first = start - start % _ALIGN
        last = -(-end // _ALIGN) * _ALIGN
        bounce = _bounce_buffer(last - first)
        got = 0
        while first + got < end:
            n = os.preadv(fd, [bounce[got : last - first]], first + got)
            if n == 0:
                break
            got += n
        if first + got < end:
            bounce.release()
            raise FormatError(f"{file.path}: unexpected end of file at byte {first + got}: truncated")
        chunk = bounce[start - first : end - first]
        out[dest : dest + end - start] = chunk
        actual = crc32(chunk) if check else expected
        chunk.release()
        bounce.release()
        if actual != expected:
            return position, actual
    return None


class ThreadedReads:
    """A lazily started thread pool that fills spans concurrently.

    Fork-aware: a child process never touches the parent's pool (whose threads do not exist
    there) and starts its own on first use. ``close()`` is safe to call twice.
    """

    def __init__(self, threads: int):
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pid != os.getpid():
            self._pool = None  # inherited across fork: its threads are not in this process
            self._pid = os.getpid()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="hfai-data-read")
        return self._pool

    def fill(
        self, jobs: list[tuple[RecordFile, list[Span]]], out: memoryview, check: bool, direct: bool
    ) -> Bad | None:
        """Fill every span of every ``(file, spans)`` job; return the earliest bad sample."""
        read = pread_spans_direct if direct else pread_spans
        pool = self._executor()
        total = sum(len(spans) for _, spans in jobs)
        chunk = max(1, -(-total // self.threads))
        futures = [
            pool.submit(read, file, spans[i : i + chunk], out, check)
            for file, spans in jobs
            for i in range(0, len(spans), chunk)
        ]
        bad = [b for b in (f.result() for f in futures) if b is not None]
        return min(bad) if bad else None

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None
