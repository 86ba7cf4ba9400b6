"""``FileReader``: random batched reads from one ffrecord file, a list of them, or a directory.

What a caller gets back: :meth:`FileReader.read` returns a list of writable 1-D ``numpy.uint8``
arrays, one per index, in the order asked. They are views into one buffer allocated for the
batch (one allocation per batch, not per sample), hold no reference to the file, and stay valid
after the reader is closed. They are copies, not views of the file's memory map: a map view
would tie the caller's arrays to the file's lifetime and turn a truncated file into SIGBUS.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from hfai.data.checksum import crc32
from hfai.data.errors import ChecksumError, DataError, FormatError
from hfai.data.fetch import ThreadedReads, check_rows, copy_mapped, gather_rows
from hfai.data.recordfile import RecordFile, pread_exact

logger = logging.getLogger(__name__)

IO_MODES = ("auto", "mmap", "pread", "direct")
# Reads in flight on a cold cache: 8-16 measured best on a 2-core VM; more only adds GIL contention.
DEFAULT_THREADS = 16
_PROBES = 4  # samples checked for page-cache residency in io="auto" after a cold batch
_VALIDATE_BLOCK = 16 << 20
PathArg = str | os.PathLike


class Batch(list):
    """What :meth:`FileReader.read` returns: a list of uint8 arrays, plus the buffer behind them.

    ``buffer`` holds the samples back to back and ``bounds[i]:bounds[i + 1]`` is sample ``i``,
    so consumers that want the whole batch (e.g. :func:`hfai.data.dataset.collate`) can use it
    in one piece, after checking :meth:`intact`.
    """

    __slots__ = ("buffer", "bounds", "_views")

    def __init__(self, buffer: np.ndarray, bounds: list[int]):
        views = [buffer[a:b] for a, b in itertools.pairwise(bounds)]
        super().__init__(views)
        self.buffer = buffer
        self.bounds = bounds
        self._views = tuple(views)

    @classmethod
    def from_rows(cls, rows: np.ndarray) -> Batch:
        """A batch whose samples are the rows of a C-contiguous 2-D uint8 array."""
        count, length = rows.shape
        batch = cls.__new__(cls)
        views = list(rows)  # row views made in C: cheaper than slicing in Python
        list.__init__(batch, views)
        batch.buffer = rows.reshape(-1)
        batch.bounds = list(range(0, count * length + 1, length))
        batch._views = tuple(views)
        return batch

    def intact(self) -> bool:
        """True while the list still holds exactly the arrays it was created with."""
        return len(self) == len(self._views) and all(a is b for a, b in zip(self, self._views, strict=True))

    def uniform_length(self) -> int | None:
        """The common sample length, or None if lengths differ or the batch is empty."""
        if not self._views:
            return None
        first, last = self.bounds[0], self.bounds[-1]
        length = self.bounds[1] - first
        if length == 0:
            return 0 if last == first else None
        return length if self.bounds == list(range(first, last + 1, length)) else None


def resolve_paths(fnames: PathArg | Sequence[PathArg]) -> list[str]:
    """The ``.ffr`` files named by a file, a dataset directory, or a list of either.

    A directory stands for every ``*.ffr`` directly inside it, ordered by plain string sort of
    the path (``PART_10.ffr`` before ``PART_9.ffr``), as in the original ffrecord.
    """
    items = [fnames] if isinstance(fnames, (str, os.PathLike)) else list(fnames)
    if not items:
        raise FormatError("no ffrecord files given")
    paths: list[str] = []
    for item in items:
        path = os.fspath(item)
        if os.path.isdir(path):
            found = sorted(
                os.path.join(path, name) for name in os.listdir(path)
                if name.endswith(".ffr") and os.path.isfile(os.path.join(path, name))
            )
            if not found:
                raise FormatError(f"{path}: directory holds no *.ffr files")
            paths.extend(found)
        elif os.path.exists(path):
            paths.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    return paths


def as_indices(indices, n: int) -> np.ndarray:
    """Validate sample indices; return them as a 1-D int64 array.

    Raises :class:`IndexError` for an index outside ``[0, n)`` (negative indices are refused,
    not counted from the end) and :class:`TypeError` for anything but integers.
    """
    array = np.asarray(indices)
    if array.ndim != 1:
        if array.ndim == 0:
            raise TypeError("read() takes a sequence of indices; use read_one(i) for one sample")
        raise TypeError(f"indices must be 1-D, got shape {array.shape}")
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise TypeError(f"sample indices must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64, copy=False)
    low, high = int(array.min()), int(array.max())
    if low < 0:
        raise IndexError(f"sample index {low} is negative; indices run from 0 to n - 1 = {n - 1}")
    if high >= n:
        raise IndexError(f"sample index {high} out of range for a dataset of {n} samples")
    return array


class FileReader:
    """Read samples of an ffrecord dataset by global index.

    Args:
        fnames: a ``.ffr`` file, a directory of them, or a list of files/directories; global
            index ``i`` runs through the files in that order.
        check_data: verify each sample's CRC-32 on every read; a mismatch raises
            :class:`~hfai.data.errors.ChecksumError` naming the file and sample.
        io: ``"auto"`` (default) copies batches whose pages are cached from a memory map and
            sends the others to a thread pool of positioned reads; ``"mmap"`` and ``"pread"``
            force one path; ``"direct"`` reads through ``O_DIRECT``, bypassing the page cache.
        threads: size of the read pool (reads in flight on a cold cache).

    Every header is validated at open (a truncated or corrupt file raises
    :class:`~hfai.data.errors.FormatError`). The reader is picklable (it reopens the files when
    unpickled) and fork-safe (a child process may keep using a reader opened before ``fork()``).
    It is not meant to be shared by threads that call :meth:`close` concurrently with reads.
    """

    def __init__(
        self,
        fnames: PathArg | Sequence[PathArg],
        check_data: bool = True,
        *,
        io: str = "auto",
        threads: int = DEFAULT_THREADS,
    ):
        if io not in IO_MODES:
            raise ValueError(f"io must be one of {IO_MODES}, got {io!r}")
        self.paths = resolve_paths(fnames)
        self.check_data = bool(check_data)
        self.io = io
        self._reads = ThreadedReads(threads)
        self._files: list[RecordFile] | None = []
        try:
            for path in self.paths:
                self._files.append(RecordFile(path))
        except BaseException:
            self.close()
            raise
        counts = np.array([f.n for f in self._files], dtype=np.int64)
        self._first = np.concatenate(([0], np.cumsum(counts)))  # global index of each file's sample 0
        self.n = int(self._first[-1])
        self._row_length = _common_length(self._files)
        self._was_cached = False  # the last batch came from the page cache (see _mode)

    # -- reading ---------------------------------------------------------------------------

    def read(self, indices: Iterable[int]) -> Batch:
        """Read the samples at ``indices`` (any order, repeats allowed) as uint8 arrays.

        Returns a :class:`Batch` (a list; see the module docstring for what the arrays are).
        Raises :class:`IndexError`, :class:`~hfai.data.errors.ChecksumError` (first bad sample
        in ``indices`` order).
        """
        files = self._open_files()
        idx = as_indices(indices, self.n)
        file_ids, local = self._locate(idx)
        starts, ends, crcs = self._gather(files, file_ids, local)
        mode = self._mode(files, file_ids, starts, ends)
        if mode == "mmap" and self._row_length is not None and len(idx):
            batch, bad = self._read_rows(files, file_ids, local, crcs, self._row_length)
        else:
            batch, bad = self._read_spans(files, file_ids, starts, ends, crcs, mode)
        if bad is not None:
            position, actual = bad
            f = 0 if file_ids is None else int(file_ids[position])
            expected = int(crcs[position])
            raise ChecksumError(files[f].path, int(idx[position]), int(local[position]), expected, actual)
        return batch

    def read_one(self, index: int) -> np.ndarray:
        """Read one sample (see :meth:`read`)."""
        if not isinstance(index, (int, np.integer)) or isinstance(index, bool):
            raise TypeError(f"sample index must be an int, not {type(index).__name__}")
        return self.read([index])[0]

    def _locate(self, idx: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
        """File id (None when there is one file) and in-file index of each global index."""
        if len(self._first) == 2:
            return None, idx
        file_ids = np.searchsorted(self._first, idx, side="right") - 1
        return file_ids, idx - self._first[file_ids]

    @staticmethod
    def _gather(files, file_ids, local):
        if file_ids is None:
            h = files[0].header
            return h.offsets[local], h.ends[local], h.checksums[local]
        starts = np.empty(len(local), dtype=np.int64)
        ends = np.empty_like(starts)
        crcs = np.empty(len(local), dtype=np.uint32)
        for f in np.unique(file_ids).tolist():
            mask = file_ids == f
            h = files[f].header
            starts[mask] = h.offsets[local[mask]]
            ends[mask] = h.ends[local[mask]]
            crcs[mask] = h.checksums[local[mask]]
        return starts, ends, crcs

    @staticmethod
    def _jobs(files, file_ids, starts, ends, dests, crcs):
        """Per file, the spans ``(position, start, end, dest, crc)`` it must fill."""
        if file_ids is None:
            spans = list(zip(range(len(starts)), starts.tolist(), ends.tolist(), dests.tolist(), crcs.tolist(),
                             strict=True))
            return [(files[0], spans)]
        jobs = []
        for f in np.unique(file_ids).tolist():
            pos = np.flatnonzero(file_ids == f)
            columns = (pos, starts[pos], ends[pos], dests[pos], crcs[pos])
            spans = list(zip(*(c.tolist() for c in columns), strict=True))
            jobs.append((files[f], spans))
        return jobs

    def _mode(self, files, file_ids, starts, ends) -> str:
        """The read path for this batch: ``io``, or in "auto" mode a guess from a few probes.

        Indices of a shuffled batch are spread over the file, so whether its first few samples
        are in the page cache stands for the whole batch. While batches keep coming from the
        cache one probe suffices (each costs a few µs): the first miss sends that batch to the
        pool and brings back the full set of probes. When residency cannot be known, assume
        cold (the pool is correct either way; the map is slow on a cold cache).
        """
        if self.io != "auto":
            return self.io
        probes = 1 if self._was_cached else _PROBES
        self._was_cached = False
        for p in range(min(probes, len(starts))):
            f = files[0 if file_ids is None else int(file_ids[p])]
            if not f.probe.resident(int(starts[p]), int(ends[p])):
                return "pread"
        self._was_cached = True
        return "mmap"

    def _read_spans(self, files, file_ids, starts, ends, crcs, mode):
        """The general path: one span per sample, copied from the map or read by the pool."""
        dests = np.zeros(len(starts) + 1, dtype=np.int64)
        np.cumsum(ends - starts, out=dests[1:])
        out = np.empty(int(dests[-1]), dtype=np.uint8)
        jobs = self._jobs(files, file_ids, starts, ends, dests[:-1], crcs)  # dests[-1]: the end of the last
        if mode == "mmap":
            view = out.data  # a memoryview of the bytes
            found = [copy_mapped(f, spans, view, self.check_data) for f, spans in jobs]
            bad = min((b for b in found if b is not None), default=None)
        else:
            bad = self._reads.fill(jobs, out.data, self.check_data, direct=mode == "direct")
        return Batch(out, dests.tolist()), bad

    def _read_rows(self, files, file_ids, local, crcs, length: int):
        """Cached samples that all have one length: gather whole rows with numpy, in C."""
        out = np.empty((len(local), length), dtype=np.uint8)
        if file_ids is None:
            gather_rows(files[0], local, out)
        else:
            for f in np.unique(file_ids).tolist():
                positions = np.flatnonzero(file_ids == f)
                gather_rows(files[f], local[positions], out, positions)
        bad = check_rows(out, crcs) if self.check_data else None
        return Batch.from_rows(out), bad

    # -- whole-dataset operations ----------------------------------------------------------

    def validate(self, progress: Callable[[int], None] | None = None) -> None:
        """Check the CRC of every sample, reading sequentially in large blocks.

        Raises :class:`~hfai.data.errors.ChecksumError` for the first bad sample;
        ``progress(k)`` is called after each block of ``k`` samples.
        """
        for f, first in zip(self._open_files(), self._first[:-1].tolist(), strict=True):
            _validate_file(f, first, progress)

    def sample_lengths(self) -> np.ndarray:
        """The byte length of every sample, by global index (int64)."""
        files = self._open_files()
        return np.concatenate([f.header.lengths for f in files]) if files else np.empty(0, np.int64)

    @property
    def legacy_files(self) -> list[str]:
        """Files whose header checksum is 0 (legacy): their headers were not validated."""
        return [f.path for f in self._open_files() if f.header.legacy]

    # -- lifecycle -------------------------------------------------------------------------

    def _open_files(self) -> list[RecordFile]:
        if self._files is None:
            raise DataError("the FileReader is closed")
        return self._files

    @property
    def closed(self) -> bool:
        return self._files is None

    @property
    def fnames(self) -> list[str]:
        """The files read, in global order (the original ffrecord's name for :attr:`paths`)."""
        return list(self.paths)

    def __len__(self) -> int:
        return self.n

    def close(self) -> None:
        """Release files, maps and read threads. Safe to call twice."""
        files, self._files = self._files, None
        self._reads.close()
        for f in files or ():
            f.close()

    def __enter__(self) -> FileReader:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: modules may already be gone
            pass

    def __getstate__(self) -> dict:
        # Only what reopening needs: descriptors, maps and threads belong to one process.
        return {
            "paths": self.paths,
            "check_data": self.check_data,
            "io": self.io,
            "threads": self._reads.threads,
        }

    def __setstate__(self, state: dict) -> None:
        # The state is FileReader's own (see __getstate__), so FileReader's __init__ takes it.
        FileReader.__init__(self, state["paths"], state["check_data"], io=state["io"], threads=state["threads"])

    def __repr__(self) -> str:
        return f"FileReader(n={self.n}, files={len(self.paths)}, io={self.io!r})"


def _common_length(files: list[RecordFile]) -> int | None:
    """The length every sample of every file has (fixed-size records), or None."""
    lengths = {f.uniform_length for f in files if f.n}
    if len(lengths) != 1:
        return None
    (length,) = lengths
    return length or None


def _validate_file(f: RecordFile, first: int, progress) -> None:
    h = f.header
    i = 0
    while i < h.n:
        # The largest run of whole samples starting at i that fits in one block (at least one).
        j = int(np.searchsorted(h.ends, h.offsets[i] + _VALIDATE_BLOCK, side="right"))
        j = min(max(j, i + 1), h.n)
        base = int(h.offsets[i])
        block = memoryview(bytearray(int(h.ends[j - 1]) - base))
        pread_exact(f.fd, block, base, f.path)
        spans = zip(range(i, j), h.offsets[i:j].tolist(), h.ends[i:j].tolist(), h.checksums[i:j].tolist(), strict=True)
        for k, start, end, expected in spans:
            actual = crc32(block[start - base : end - base])
            if actual != expected:
                raise ChecksumError(f.path, first + k, k, expected, actual)
        if progress is not None:
            progress(j - i)
        i = j
