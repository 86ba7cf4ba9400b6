"""Gradient buckets: which parameters share a bucket and where each lies in the slot. Pure.

Parameters are bucketed in reverse registration order (roughly the order autograd produces their
gradients), each bucket holds one summing dtype, and the first bucket is small so the first
reduction starts early in the backward pass, as in torch's DDP.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hfai.reduce.layout import SLICE_ALIGN_BYTES, round_up

FIRST_BUCKET_BYTES = 1 << 20


@dataclass(frozen=True)
class ParamSpec:
    numel: int
    itemsize: int  # of the summing dtype
    acc_key: int  # summing dtype code; a bucket never mixes two


@dataclass(frozen=True)
class Bucket:
    index: int
    offset: int  # bytes into the slot
    nbytes: int
    itemsize: int
    params: tuple[int, ...]  # parameter indices
    param_offsets: tuple[int, ...]  # bytes into the slot, one per entry of ``params``

    @property
    def numel(self) -> int:
        return self.nbytes // self.itemsize


def assign_buckets(specs: Sequence[ParamSpec], cap_bytes: int, first_bytes: int = FIRST_BUCKET_BYTES) -> list[Bucket]:
    """Assign parameters to buckets. Bucket starts are aligned to ``SLICE_ALIGN_BYTES``."""
    if cap_bytes <= 0:
        raise ValueError(f"bucket cap must be positive, got {cap_bytes}")
    buckets: list[Bucket] = []
    offset = 0
    open_params: list[int] = []
    open_offsets: list[int] = []
    open_bytes = 0
    open_key: int | None = None

    def close() -> None:
        nonlocal offset, open_params, open_offsets, open_bytes, open_key
        if open_params:
            item = specs[open_params[0]].itemsize
            buckets.append(
                Bucket(len(buckets), offset, open_bytes, item, tuple(open_params), tuple(open_offsets))
            )
            offset = round_up(offset + open_bytes, SLICE_ALIGN_BYTES)
        open_params, open_offsets, open_bytes, open_key = [], [], 0, None

    for i in reversed(range(len(specs))):
        spec = specs[i]
        nbytes = spec.numel * spec.itemsize
        cap = min(first_bytes, cap_bytes) if not buckets else cap_bytes
        if open_params and (spec.acc_key != open_key or open_bytes + nbytes > cap):
            close()
        open_key = spec.acc_key
        open_params.append(i)
        open_offsets.append(offset + open_bytes)
        open_bytes += nbytes
    close()
    return buckets


def total_bytes(buckets: Sequence[Bucket]) -> int:
    return round_up(buckets[-1].offset + buckets[-1].nbytes, SLICE_ALIGN_BYTES) if buckets else 0
