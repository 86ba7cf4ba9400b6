"""The exceptions ``hfai.data`` raises, in one small tree.

Catch :class:`DataError` to handle every failure of this package at once. Out-of-range and
negative sample indices raise the built-in :class:`IndexError`, and wrong argument types raise
:class:`TypeError`, as any Python sequence would.
"""

from __future__ import annotations


class DataError(Exception):
    """Base class of every error ``hfai.data`` raises on purpose."""


class FormatError(DataError, ValueError):
    """A file or directory is not a valid ffrecord dataset (truncated, corrupt header, no files).

    Raised when the reader opens it, so a bad file never yields garbage samples later.
    """


class ChecksumError(DataError):
    """A sample's bytes do not match the CRC-32 stored in its file's header.

    Attributes:
        path: the ``.ffr`` file holding the sample.
        index: the sample's index in the dataset the caller opened (global index).
        local_index: the sample's index inside ``path``.
    """

    def __init__(self, path: str, index: int, local_index: int, expected: int, actual: int):
        self.path = path
        self.index = index
        self.local_index = local_index
        self.expected = expected
        self.actual = actual
        where = f"sample {index}" if index == local_index else f"sample {index} (#{local_index} in file)"
        super().__init__(
            f"{path}: {where}: checksum mismatch (stored {expected:#010x}, read {actual:#010x}); "
            "the file is corrupt, re-create or re-copy it"
        )


class WriterError(DataError):
    """A writer was misused: too many samples, too few at close, or a write after close.

    The writer removes its temporary file first, so no partial file is left under the final name.
    """


class LegacyHeaderWarning(UserWarning):
    """A file's header checksum is 0, which marks a legacy file whose header is not validated."""
