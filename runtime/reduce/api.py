"""Module-level functions over a default group, in the style of ``torch.distributed``."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import torch
import torch.distributed as dist

from hfai.reduce.dtypes import ReduceOp, rule_for
from hfai.reduce.errors import NotInitializedError
from hfai.reduce.group import ReduceConfig, ReduceGroup

_lock = threading.Lock()
_default: ReduceGroup | None = None


def init(
    process_group=None, config: ReduceConfig | None = None, node_key: str | None = None
) -> ReduceGroup:
    """Create the default group (collective; see :meth:`ReduceGroup.create`) and return it.

    Calling it again replaces the default group (the old one is closed).
    """
    global _default
    group = ReduceGroup.create(process_group, config, node_key)
    with _lock:
        old, _default = _default, group
    if old is not None:
        old.close()
    return group


def is_initialized() -> bool:
    return _default is not None


def get_group() -> ReduceGroup:
    """The default group, created on first use over the world group with default settings."""
    if _default is None:
        if not (dist.is_available() and dist.is_initialized()):
            raise NotInitializedError(
                "no reduce group: call torch.distributed.init_process_group(...) "
                "(and optionally hfai.reduce.init(...)) first"
            )
        return init()
    return _default


def destroy() -> None:
    """Close the default group (not collective). Idempotent."""
    global _default
    with _lock:
        old, _default = _default, None
    if old is not None:
        old.close()


def allreduce(
    tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM, group: ReduceGroup | None = None
) -> torch.Tensor:
    """All-reduce ``tensor`` in place over ``group`` (default group if None); returns it."""
    return (group or get_group()).allreduce(tensor, op)


def allreduce_coalesced(
    tensors: Sequence[torch.Tensor], op: ReduceOp = ReduceOp.SUM, group: ReduceGroup | None = None
) -> list[torch.Tensor]:
    """All-reduce several tensors in place with one collective per summing dtype.

    Cheaper than one call per tensor for many small tensors (one barrier round instead of many).
    Every rank must pass the same list of shapes and dtypes, in the same order.
    """
    group = group or get_group()
    with torch.no_grad():
        _coalesced(group, tensors, op)
    return list(tensors)


def _coalesced(group: ReduceGroup, tensors: Sequence[torch.Tensor], op: ReduceOp) -> None:
    by_acc: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_acc.setdefault(rule_for(t.dtype).acc, []).append(t)
    for acc in sorted(by_acc, key=str):
        members = by_acc[acc]
        flat = torch.cat([t.reshape(-1).to(acc) for t in members])
        group.allreduce(flat, op)
        offset = 0
        for t in members:
            n = t.numel()
            t.copy_(flat[offset : offset + n].view(t.shape))
            offset += n
