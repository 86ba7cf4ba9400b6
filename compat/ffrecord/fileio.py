"""``ffrecord.fileio``: ``FileReader``, ``FileWriter`` and ``checkFsAlign``.

The reader and writer are :mod:`hfai.data`'s (byte-compatible with the original's files, without
its known defects: see ``docs/data.md``).
"""

from __future__ import annotations

import fcntl
import struct

from hfai.data.reader import FileReader
from hfai.data.writer import FileWriter

# The ioctl request by which HFAiLab's 3FS file system reports whether a file's data is aligned
# for direct I/O (the original's C++ asks the same); other file systems reject it.
_FS_IOC_CHECK_FS_ALIGN = 0x80046664


def checkFsAlign(fd: int) -> bool:  # noqa: N802 (the original's name)
    """Whether the file system holding open file ``fd`` reports aligned data (3FS); False
    wherever the request is unknown (every ordinary file system)."""
    buf = bytearray(4)
    try:
        fcntl.ioctl(fd, _FS_IOC_CHECK_FS_ALIGN, buf)
    except OSError:
        return False
    return struct.unpack("i", buf)[0] == 1


__all__ = ["FileReader", "FileWriter", "checkFsAlign"]
