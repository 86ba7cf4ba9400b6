"""Summing kernels over shared buffers, and the dtype rules. numpy only: no torch, no I/O.

numpy's ufuncs run single-threaded with the GIL released, which is what we want: the parallelism
comes from every local rank summing its own slice at the same time, and a DDP communication
thread can sum while the autograd thread runs. Work is done in cache-sized blocks so that the sum
of a block is still in L2 when it is copied to the other ranks' slots.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

#: Default cache block: 32 Ki fp32 elements (128 KiB); N inputs plus the output stay in L2.
DEFAULT_BLOCK_BYTES = 128 * 1024


def sum_into(srcs: Sequence[np.ndarray], out: np.ndarray, scale: float, block: int) -> None:
    """``out[:] = scale * sum(srcs)``, block by block. ``out`` may alias ``srcs[0]``.

    Sources are added in rank order, so every rank computes bit-identical sums.
    """
    n = out.shape[0]
    for b in range(0, n, block):
        e = min(n, b + block)
        o = out[b:e]
        if len(srcs) == 1:
            np.copyto(o, srcs[0][b:e])
        else:
            np.add(srcs[0][b:e], srcs[1][b:e], out=o)
            for s in srcs[2:]:
                np.add(o, s[b:e], out=o)
        if scale != 1.0:
            np.multiply(o, scale, out=o)


def sum_into_all(slots: Sequence[np.ndarray], scale: float, block: int) -> None:
    """Replace every ``slots[k]`` with ``scale * sum(slots)`` (the in-place, shm-resident mode).

    The sum is formed in ``slots[0]`` one block at a time and copied to the others while it is
    still cached: one read of every input and one write of every output, nothing more.
    """
    n = slots[0].shape[0]
    for b in range(0, n, block):
        e = min(n, b + block)
        acc = slots[0][b:e]
        for s in slots[1:]:
            np.add(acc, s[b:e], out=acc)
        if scale != 1.0:
            np.multiply(acc, scale, out=acc)
        for s in slots[1:]:
            np.copyto(s[b:e], acc)


def scaled_copy(dst: np.ndarray, src: np.ndarray, scale: float, block: int) -> None:
    """``dst[:] = scale * src`` in blocks."""
    n = dst.shape[0]
    for b in range(0, n, block):
        e = min(n, b + block)
        if scale != 1.0:
            np.multiply(src[b:e], scale, out=dst[b:e])
        else:
            np.copyto(dst[b:e], src[b:e])
