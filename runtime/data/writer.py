"""Writers for ffrecord files: one file (:class:`FileWriter`) or a directory of parts
(:class:`MultiFileWriter`).

Both write under a temporary name in the destination's directory and rename onto the final
name only when closed with exactly the declared number of samples, so a crash, an exception or
a miscount never leaves a half-written dataset where a reader would find it.
"""

from __future__ import annotations

import logging
import math
import os
import secrets
import shutil
import warnings
from typing import BinaryIO

import numpy as np

from hfai.data.checksum import crc32
from hfai.data.errors import WriterError
from hfai.data.layout import encode_header, header_size

logger = logging.getLogger(__name__)

PART_NAME = "PART_{:05d}.ffr"
"""File name of part ``k`` written by :class:`MultiFileWriter` (the original's naming)."""

_WRITE_BUFFER = 1 << 20


def _temp_name(path: str) -> str:
    directory, name = os.path.split(os.path.abspath(path))
    return os.path.join(directory, f".{name}.{secrets.token_hex(4)}.tmp")


def _create_temp(path: str) -> tuple[int, str]:
    """Create a new empty temporary file beside ``path``; return its fd and name.

    Not tempfile.mkstemp: its 0600 mode would stick to the published file; this one gets the
    usual 0666 & ~umask.
    """
    while True:
        tmp = _temp_name(path)
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
            return os.open(tmp, flags, 0o666), tmp
        except FileExistsError:
            continue


def as_bytes(buffer) -> memoryview:
    """A flat byte view of ``buffer``'s full contents, whatever its item type or shape.

    The original ffrecord wrote ``shape[0]`` bytes of a numpy array; this writes all of them.
    """
    try:
        view = memoryview(buffer)
    except TypeError as e:
        raise TypeError(
            f"write_one() needs a bytes-like object (bytes, bytearray, memoryview, numpy array), "
            f"not {type(buffer).__name__}"
        ) from e
    if view.ndim == 0 or not view.c_contiguous:
        return memoryview(view.tobytes())
    return view.cast("B")


class FileWriter:
    """Write exactly ``n`` samples to the ffrecord file ``path``.

    Use as a context manager, or call :meth:`close`. Samples go to a temporary file next to
    ``path``; :meth:`close` writes the header and renames it onto ``path`` (replacing an existing
    file) only if exactly ``n`` samples were written. Otherwise, and when the ``with`` block raises,
    the temporary file is removed and ``path`` is left untouched. ``fsync=True`` makes the file
    durable before it appears under its name.
    """

    def __init__(self, path: str | os.PathLike, n: int, *, fsync: bool = True):
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool):
            raise TypeError(f"n must be an int, not {type(n).__name__}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self.path = os.fspath(path)
        self.n = int(n)
        self._fsync = fsync
        self._count = 0
        self._checksums = np.zeros(self.n, dtype=np.uint32)
        self._offsets = np.zeros(self.n, dtype=np.int64)
        self._position = header_size(self.n)
        fd, self._tmp_path = _create_temp(self.path)
        self._file: BinaryIO | None = os.fdopen(fd, "wb", buffering=_WRITE_BUFFER)
        # Reserve the header; its real contents are only known at close.
        self._file.seek(self._position)

    @property
    def count(self) -> int:
        """Samples written so far."""
        return self._count

    @property
    def closed(self) -> bool:
        return self._file is None

    def write_one(self, buffer) -> None:
        """Append one sample: the full bytes of any bytes-like object (numpy arrays included).

        Raises :class:`WriterError` (after discarding the file) if ``n`` samples were already written.
        """
        if self._file is None:
            raise WriterError(f"{self.path}: write_one() on a closed writer")
        if self._count >= self.n:
            self.abort()
            raise WriterError(
                f"{self.path}: more than the declared {self.n} samples written; file discarded"
            )
        data = as_bytes(buffer)
        self._file.write(data)
        self._checksums[self._count] = crc32(data)
        self._offsets[self._count] = self._position
        self._position += data.nbytes
        self._count += 1

    def close(self) -> None:
        """Finish the file and move it to ``path``. Safe to call twice.

        Raises :class:`WriterError` (and leaves no file at ``path``) unless exactly ``n`` samples
        were written.
        """
        if self._file is None:
            return
        if self._count != self.n:
            count = self._count
            self.abort()
            raise WriterError(
                f"{self.path}: closed after {count} of the declared {self.n} samples; file discarded"
            )
        try:
            self._file.seek(0)
            self._file.write(encode_header(self._checksums, self._offsets))
            self._file.flush()
            if self._fsync:
                os.fsync(self._file.fileno())
            self._file.close()
            self._file = None
            os.replace(self._tmp_path, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Discard everything written; ``path`` is left as it was. Safe to call twice."""
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass  # the data is being thrown away: a failed flush changes nothing
            self._file = None
        try:
            os.unlink(self._tmp_path)
        except FileNotFoundError:
            pass  # aborted before (safe to call twice): nothing left to remove

    def __enter__(self) -> FileWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()

    def __del__(self) -> None:
        if getattr(self, "_file", None) is not None:
            warnings.warn(f"unclosed FileWriter for {self.path}; discarding it", ResourceWarning, stacklevel=2)
            self.abort()


def part_sizes(n: int, nfiles: int) -> list[int]:
    """Samples per part when ``n`` samples are split into at most ``nfiles`` parts.

    Like the original: ``ceil(n / nfiles)`` per part, the last part holding the rest, and no
    empty parts (so fewer than ``nfiles`` parts may be written); ``n == 0`` gives one empty part.
    """
    if nfiles < 1:
        raise ValueError(f"nfiles must be >= 1, got {nfiles}")
    if n == 0:
        return [0]
    per_part = math.ceil(n / nfiles)
    full, rest = divmod(n, per_part)
    return [per_part] * full + ([rest] if rest else [])


class MultiFileWriter:
    """Write ``n`` samples into a new directory ``path`` of parts named ``PART_%05d.ffr``.

    The parts are built in a temporary directory next to ``path``, which is renamed onto ``path``
    at a successful :meth:`close`; ``path`` must not exist then (an empty directory is replaced).
    Missing parent directories of ``path`` are created.
    Global sample order is part order, so :class:`~hfai.data.FileReader` on ``path`` reads the
    samples back in the order written.
    """

    def __init__(self, path: str | os.PathLike, n: int, nfiles: int, *, fsync: bool = True):
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self.path = os.fspath(path)
        self.n = int(n)
        self._sizes = part_sizes(self.n, nfiles)
        self._fsync = fsync
        if os.path.exists(self.path) and not (os.path.isdir(self.path) and not os.listdir(self.path)):
            raise WriterError(f"{self.path} already exists; MultiFileWriter creates a new directory")
        self._tmp_dir = _temp_name(self.path)
        # Missing parents are created, as the original's dump() does for its directory.
        os.makedirs(os.path.dirname(self._tmp_dir), exist_ok=True)
        # Not tempfile.mkdtemp: its 0700 mode would stick to the published dataset.
        os.mkdir(self._tmp_dir, 0o777)
        self._part = 0
        self._count = 0
        self._writer: FileWriter | None = self._open_part(0)
        self._closed = False

    def _open_part(self, k: int) -> FileWriter:
        path = os.path.join(self._tmp_dir, PART_NAME.format(k))
        return FileWriter(path, self._sizes[k], fsync=self._fsync)

    def write_one(self, buffer) -> None:
        """Append one sample (see :meth:`FileWriter.write_one`)."""
        if self._closed:
            raise WriterError(f"{self.path}: write_one() on a closed writer")
        if self._count >= self.n:
            self.abort()
            raise WriterError(f"{self.path}: more than the declared {self.n} samples written; discarded")
        writer = self._writer
        assert writer is not None  # only abort() clears it, and abort() closes the writer
        while writer.count == writer.n:
            writer.close()
            self._part += 1
            self._writer = writer = self._open_part(self._part)
        writer.write_one(buffer)
        self._count += 1

    def close(self) -> None:
        """Finish the last part and move the directory to ``path``. Safe to call twice."""
        if self._closed:
            return
        if self._count != self.n:
            count = self._count
            self.abort()
            raise WriterError(
                f"{self.path}: closed after {count} of the declared {self.n} samples; discarded"
            )
        assert self._writer is not None  # only abort() clears it, and abort() closes the writer
        try:
            self._writer.close()
            if os.path.isdir(self.path) and not os.listdir(self.path):
                os.rmdir(self.path)
            os.rename(self._tmp_dir, self.path)
            self._closed = True
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Discard all parts written; ``path`` is left as it was. Safe to call twice."""
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        shutil.rmtree(self._tmp_dir, ignore_errors=True)
        self._closed = True

    def __enter__(self) -> MultiFileWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        else:
            self.close()
