"""One open ``.ffr`` file: its validated header, a file descriptor and a read-only memory map.

The file must not be modified or truncated while it is open (reading a truncated memory map
kills the process with SIGBUS), the same contract as the original ffrecord.
"""

from __future__ import annotations

import errno
import mmap
import os
import warnings

import numpy as np

from hfai.data.errors import DataError, FormatError, LegacyHeaderWarning
from hfai.data.layout import PREFIX_SIZE, Header, decode_header, decode_prefix, header_size
from hfai.data.residency import PageProbe

_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def pread_exact(fd: int, view: memoryview, offset: int, path: str) -> None:
    """Fill ``view`` from ``fd`` at ``offset``; a short file raises :class:`FormatError`."""
    while view.nbytes:
        got = os.preadv(fd, [view], offset)
        if got == 0:
            raise FormatError(f"{path}: unexpected end of file at byte {offset}: the file was truncated")
        view = view[got:]
        offset += got


class RecordFile:
    """An open ffrecord file. Raises :class:`FormatError` at open if its header is bad."""

    def __init__(self, path: str):
        self.path = path
        self._fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
        self._direct_fd: int | None = None
        self.map: mmap.mmap | None = None
        try:
            self.header = self._read_header()
            self._map_file()
        except BaseException:
            self.close()
            raise
        self.probe = PageProbe(self.map)
        lengths = self.header.lengths
        # Fixed-size records allow reading a batch as rows of an (n, L) array.
        self.uniform_length: int | None = (
            int(lengths[0]) if self.n and bool(np.all(lengths == lengths[0])) else None
        )
        if self.header.legacy and self.header.n:
            warnings.warn(
                f"{path}: header checksum is 0 (a legacy file), so its header is not validated",
                LegacyHeaderWarning,
                stacklevel=4,
            )

    @property
    def n(self) -> int:
        return self.header.n

    @property
    def fd(self) -> int:
        return self._fd

    def _read_header(self) -> Header:
        size = os.fstat(self._fd).st_size
        prefix = os.pread(self._fd, PREFIX_SIZE, 0)
        _, n = decode_prefix(prefix, size, self.path)
        buf = bytearray(header_size(n))
        pread_exact(self._fd, memoryview(buf), 0, self.path)
        return decode_header(buf, size, self.path)

    def _map_file(self) -> None:
        self.map = mmap.mmap(self._fd, 0, prot=mmap.PROT_READ)
        # Samples are read at random: readahead would only evict useful pages.
        self.map.madvise(mmap.MADV_RANDOM)
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)

    def mapping(self) -> mmap.mmap:
        """The file's read-only memory map; :class:`DataError` once the file is closed."""
        if self.map is None:
            raise DataError(f"{self.path}: read after close()")
        return self.map

    def direct_fd(self) -> int:
        """A second descriptor opened with ``O_DIRECT`` (bypassing the page cache), opened once."""
        if self._direct_fd is None:
            flag = getattr(os, "O_DIRECT", None)
            if flag is None:
                raise DataError("io='direct' needs O_DIRECT, which this platform lacks")
            try:
                self._direct_fd = os.open(self.path, os.O_RDONLY | flag | _O_CLOEXEC)
            except OSError as e:
                if e.errno == errno.EINVAL:
                    raise DataError(
                        f"{self.path}: the file system does not support O_DIRECT; use io='auto'"
                    ) from e
                raise
        return self._direct_fd

    def close(self) -> None:
        """Release the map and descriptors. Safe to call twice."""
        if self.map is not None:
            self.map.close()
            self.map = None
        for name in ("_fd", "_direct_fd"):
            fd = getattr(self, name)
            if fd is not None and fd >= 0:
                os.close(fd)
            setattr(self, name, None)
