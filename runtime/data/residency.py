"""Ask the kernel whether file pages are in the page cache (Linux ``mincore(2)`` via ctypes).

The reader uses this to pick a read path per batch: copying from a memory map is the fastest
way to read cached pages, but a page fault on an uncached page blocks the calling thread one
page at a time, so cold batches go to a pool of threads doing positioned reads instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

import numpy as np

PAGE = mmap.PAGESIZE


def _load_mincore():
    if not hasattr(os, "sched_getaffinity"):  # not Linux: no mincore semantics we rely on
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = libc.mincore
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn


_MINCORE = _load_mincore()


class PageProbe:
    """Residency checks over one read-only memory map.

    ``resident(start, end)`` returns True if every page of file bytes ``[start, end)`` is cached,
    False if one is not, and None if the platform cannot tell. One check costs a few
    microseconds, so callers probe a few samples per batch, not every sample.
    """

    def __init__(self, mapping: mmap.mmap | None):
        self._base = 0
        if mapping is not None and _MINCORE is not None:
            # Take the address and drop the array at once: a live export would stop mmap.close().
            array = np.frombuffer(mapping, dtype=np.uint8)
            self._base = array.ctypes.data
            del array
        self._grow(16)

    def _grow(self, pages: int) -> None:
        # A ctypes array, its address taken once: numpy's .ctypes costs more than mincore itself.
        self._vector = (ctypes.c_ubyte * pages)()
        self._vector_address = ctypes.addressof(self._vector)

    @property
    def available(self) -> bool:
        return self._base != 0

    def resident(self, start: int, end: int) -> bool | None:
        if not self._base:
            return None
        if end <= start:
            return True
        first = start - start % PAGE
        pages = (end - first + PAGE - 1) // PAGE
        if pages > len(self._vector):
            self._grow(pages)
        if _MINCORE(self._base + first, end - first, self._vector_address) != 0:
            return None
        return all(flag & 1 for flag in self._vector[:pages])
