"""Byte layout of a node's shared-memory arena, and how work is split between ranks. Pure: no I/O.

An arena is one POSIX shared-memory segment::

    offset 0          header: HEADER_LINES_BEFORE_RANKS global lines, then one line per local
                      rank (LINE_BYTES each, so two ranks never write the same cache line pair)
    header_bytes      slot 0 | slot 1 | ... | slot N-1     (slot_bytes each, page aligned)
    + N*slot_bytes    result region                        (slot_bytes, page aligned)

Header words are little-endian int64. Each word has exactly one writer (its rank; the abort words
are the exception and are only ever set, never cleared), so no atomic read-modify-write is needed:
aligned 8-byte stores and loads are single-copy atomic on x86-64 and aarch64.

Global line (index 0):  MAGIC, VERSION, NRANKS, SLOT_BYTES, ABORT, ABORT_RANK, ABORT_CODE
Rank line  (1 + r):     GEN, PID, START_TIME, ATTACHED, DESC_SEQ, DESC_OFFSET, DESC_NUMEL,
                        DESC_DTYPE, DESC_OP
"""

from __future__ import annotations

from dataclasses import dataclass

MAGIC = 0x4846_5245_4455_4345  # "HFREDUCE"
VERSION = 1
PAGE = 4096
LINE_BYTES = 128  # two 64-byte lines: the adjacent-line prefetcher would otherwise share them
WORDS_PER_LINE = LINE_BYTES // 8
HEADER_LINES_BEFORE_RANKS = 1
#: Slices handed to different ranks start on this many bytes, so no two ranks write one line.
SLICE_ALIGN_BYTES = 64

# Global line word indices.
G_MAGIC, G_VERSION, G_NRANKS, G_SLOT_BYTES, G_ABORT, G_ABORT_RANK, G_ABORT_CODE = range(7)
# Rank line word indices (relative to the start of the line).
R_GEN, R_PID, R_START_TIME, R_ATTACHED = range(4)
R_DESC_SEQ, R_DESC_OFFSET, R_DESC_NUMEL, R_DESC_DTYPE, R_DESC_OP = range(4, 9)
DESC_WORDS = 5

# Abort reason codes written to G_ABORT_CODE.
ABORT_ERROR = 1
ABORT_SIZE_MISMATCH = 2
ABORT_PEER = 3
ABORT_INTER_NODE = 4


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class ArenaLayout:
    """Offsets of one arena for ``nranks`` local ranks with ``slot_bytes`` per rank."""

    nranks: int
    slot_bytes: int

    def __post_init__(self) -> None:
        if self.nranks < 1:
            raise ValueError(f"nranks must be >= 1, got {self.nranks}")
        if self.slot_bytes < 0 or self.slot_bytes % PAGE:
            raise ValueError(f"slot_bytes must be a non-negative multiple of {PAGE}")

    @property
    def header_bytes(self) -> int:
        return round_up((HEADER_LINES_BEFORE_RANKS + self.nranks) * LINE_BYTES, PAGE)

    @property
    def header_words(self) -> int:
        return self.header_bytes // 8

    def slot_offset(self, local_rank: int) -> int:
        if not 0 <= local_rank < self.nranks:
            raise IndexError(f"local rank {local_rank} out of range 0..{self.nranks - 1}")
        return self.header_bytes + local_rank * self.slot_bytes

    @property
    def result_offset(self) -> int:
        return self.header_bytes + self.nranks * self.slot_bytes

    @property
    def total_bytes(self) -> int:
        return self.result_offset + self.slot_bytes

    def rank_word(self, local_rank: int, field: int) -> int:
        """Index (in int64 words) of ``field`` in ``local_rank``'s header line."""
        return (HEADER_LINES_BEFORE_RANKS + local_rank) * WORDS_PER_LINE + field


def slot_bytes_for(capacity_bytes: int) -> int:
    """The slot size that holds ``capacity_bytes`` (page aligned, at least one page)."""
    if capacity_bytes < 0:
        raise ValueError(f"capacity must be >= 0, got {capacity_bytes}")
    return max(PAGE, round_up(capacity_bytes, PAGE))


def partition(numel: int, parts: int, itemsize: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``parts`` contiguous ``(start, stop)`` ranges.

    Every start is a multiple of ``SLICE_ALIGN_BYTES`` bytes, so ranks summing neighbouring
    slices never write the same cache line. Trailing ranges may be empty.
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    align = max(1, SLICE_ALIGN_BYTES // itemsize)
    per = round_up(-(-numel // parts), align) if numel else 0
    ranges = []
    for i in range(parts):
        start = min(numel, i * per)
        ranges.append((start, min(numel, start + per)))
    return ranges


def chunks(numel: int, chunk_elems: int) -> list[tuple[int, int]]:
    """``(start, stop)`` chunks of at most ``chunk_elems``; one empty chunk when ``numel`` is 0.

    The empty chunk matters: a collective on an empty tensor still meets its peers, which is how a
    rank that passes 0 elements while others pass more gets a size-mismatch error, not a hang.
    """
    if chunk_elems < 1:
        raise ValueError(f"chunk_elems must be >= 1, got {chunk_elems}")
    if numel == 0:
        return [(0, 0)]
    return [(s, min(numel, s + chunk_elems)) for s in range(0, numel, chunk_elems)]
