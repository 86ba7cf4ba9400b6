"""The ffrecord byte layout: pure encode/decode functions, no I/O.

One ``.ffr`` file, all integers little-endian, packed, no padding::

    offset     width  type         field
    0          4      uint32       checksum_meta: CRC-32 of file bytes [4, 12 + 12N)
    4          8      int64        N, the number of samples (0 is allowed: a 12-byte file)
    12         4N     uint32[N]    CRC-32 of each sample
    12 + 4N    8N     int64[N]     absolute file offset of each sample
    12 + 12N   ...    bytes        the samples back to back; offsets[0] == 12 + 12N

Sample lengths are not stored: sample i ends where sample i+1 starts, the last one at the end of
the file. ``checksum_meta == 0`` marks a legacy file whose header checksum is not checked.
The offsets table is 8-byte aligned only for odd N, so it is decoded from a copy.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from hfai.data.checksum import crc32
from hfai.data.errors import FormatError

PREFIX = struct.Struct("<Iq")
"""checksum_meta (uint32) and N (int64): the first 12 bytes of every file."""

PREFIX_SIZE = PREFIX.size
LEGACY_CHECKSUM = 0


def header_size(n: int) -> int:
    """Bytes taken by the header of a file with ``n`` samples; also where sample 0 starts."""
    return PREFIX_SIZE + 12 * n


@dataclass(frozen=True, eq=False)
class Header:
    """A decoded, validated header. Arrays are aligned, native-endian and read-only."""

    n: int
    checksums: np.ndarray  # uint32[n]
    offsets: np.ndarray  # int64[n], absolute start of each sample
    ends: np.ndarray  # int64[n], absolute end (exclusive) of each sample
    legacy: bool  # checksum_meta was 0: the header itself was not checksummed
    file_size: int

    @property
    def lengths(self) -> np.ndarray:
        return self.ends - self.offsets


def encode_header(checksums, offsets) -> bytes:
    """The header bytes for samples with these CRCs and absolute offsets (same length)."""
    checksums = np.asarray(checksums, dtype="<u4")
    offsets = np.asarray(offsets, dtype="<i8")
    if checksums.shape != offsets.shape or checksums.ndim != 1:
        raise ValueError("checksums and offsets must be 1-D and of equal length")
    body = struct.pack("<q", len(checksums)) + checksums.tobytes() + offsets.tobytes()
    return struct.pack("<I", crc32(body)) + body


def decode_prefix(prefix: bytes | bytearray, file_size: int, path: str) -> tuple[int, int]:
    """Return ``(checksum_meta, n)`` from a file's first bytes, refusing impossible values.

    ``prefix`` holds the first ``min(file_size, 12)`` bytes of the file.
    """
    if file_size < PREFIX_SIZE or len(prefix) < PREFIX_SIZE:
        raise FormatError(
            f"{path}: truncated header ({file_size} bytes; an ffrecord file has at least "
            f"{PREFIX_SIZE}), not an ffrecord file or an unfinished copy"
        )
    checksum_meta, n = PREFIX.unpack_from(prefix)
    if n < 0 or header_size(n) > file_size:
        raise FormatError(
            f"{path}: header declares {n} samples, which needs at least {max(header_size(n), 0)} "
            f"bytes, but the file has {file_size}: truncated or not an ffrecord file"
        )
    return checksum_meta, n


def decode_header(buf: bytes | bytearray, file_size: int, path: str) -> Header:
    """Decode and validate a header; ``buf`` holds at least the file's first 12 + 12N bytes.

    Raises :class:`FormatError` naming ``path`` if the header checksum does not match (unless it
    is 0, the legacy marker) or the offsets do not describe samples inside the file.
    """
    checksum_meta, n = decode_prefix(buf[:PREFIX_SIZE], file_size, path)
    end = header_size(n)
    if len(buf) < end:
        raise FormatError(f"{path}: truncated header ({len(buf)} of {end} bytes)")
    view = memoryview(buf)[:end]
    legacy = checksum_meta == LEGACY_CHECKSUM
    if not legacy:
        actual = crc32(view[4:end])
        if actual != checksum_meta:
            raise FormatError(
                f"{path}: header checksum mismatch (stored {checksum_meta:#010x}, computed "
                f"{actual:#010x}): the header is corrupt"
            )
    # astype() copies into a fresh aligned array: the offsets table may sit at an odd address.
    checksums = np.frombuffer(view, dtype="<u4", count=n, offset=PREFIX_SIZE).astype(np.uint32)
    offsets = np.frombuffer(view, dtype="<i8", count=n, offset=PREFIX_SIZE + 4 * n).astype(np.int64)
    _check_offsets(offsets, end, file_size, path)
    ends = np.empty_like(offsets)
    ends[:-1] = offsets[1:]
    if n:
        ends[-1] = file_size
    for array in (checksums, offsets, ends):
        array.flags.writeable = False
    return Header(n, checksums, offsets, ends, legacy, file_size)


def _check_offsets(offsets: np.ndarray, data_start: int, file_size: int, path: str) -> None:
    if len(offsets) == 0:
        return
    if offsets[0] != data_start:
        raise FormatError(
            f"{path}: corrupt header: first sample offset is {int(offsets[0])}, expected {data_start}"
        )
    if len(offsets) > 1 and bool(np.any(np.diff(offsets) < 0)):
        bad = int(np.argmax(np.diff(offsets) < 0)) + 1
        raise FormatError(f"{path}: corrupt header: offset of sample {bad} goes backwards")
    if offsets[-1] > file_size:
        raise FormatError(
            f"{path}: last sample starts at {int(offsets[-1])} beyond the file's {file_size} "
            "bytes: truncated file"
        )
