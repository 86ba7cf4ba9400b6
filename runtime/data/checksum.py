"""CRC-32 (the zlib polynomial, start value 0), as stored in ffrecord headers.

``isal`` computes the same CRC several times faster than ``zlib``, so use it when it is installed.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

_fast_crc32: Callable[[bytes, int], int] | None
try:
    from isal.isal_zlib import crc32 as _fast_crc32
except ImportError:  # pragma: no cover - isal is a declared dependency; keep working without it
    _fast_crc32 = None

crc32: Callable[..., int] = _fast_crc32 if _fast_crc32 is not None else zlib.crc32
"""``crc32(data) -> int``: CRC-32 of a bytes-like object, identical to ``zlib.crc32(data)``."""

BACKEND = "isal" if _fast_crc32 is not None else "zlib"
