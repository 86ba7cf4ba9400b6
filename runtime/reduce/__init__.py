"""hfai.reduce (hfreduce): all-reduce summed by CPU cores over shared memory inside a node.

Inside a node every rank puts its buffer in one POSIX shared-memory arena and each rank sums its
own slice of all inputs (reduce-scatter style), so the node's cores share the work at memory
speed. Between nodes one leader per node all-reduces the node sum over ``torch.distributed``
(gloo). :class:`DistributedDataParallel` is a drop-in for torch's, keeping gradient buckets in
shared memory. Needs ``torch.distributed`` initialised first. See docs/reduce.md.

Importing this package creates nothing: arenas are made by :func:`init` / the first collective.
"""

from hfai.reduce.api import (
    allreduce,
    allreduce_coalesced,
    destroy,
    get_group,
    init,
    is_initialized,
)
from hfai.reduce.ddp import DistributedDataParallel
from hfai.reduce.dtypes import SUPPORTED_DTYPES, ReduceOp
from hfai.reduce.errors import (
    CapacityError,
    GroupAbortedError,
    GroupClosedError,
    InterNodeError,
    NotInitializedError,
    PeerDiedError,
    PeerError,
    PeerTimeoutError,
    ReduceError,
    SizeMismatchError,
    UnsupportedPlatformError,
    UnsupportedTensorError,
)
from hfai.reduce.group import ReduceConfig, ReduceGroup
from hfai.reduce.shm import remove_stale_segments

__all__ = [
    "SUPPORTED_DTYPES",
    "CapacityError",
    "DistributedDataParallel",
    "GroupAbortedError",
    "GroupClosedError",
    "InterNodeError",
    "NotInitializedError",
    "PeerDiedError",
    "PeerError",
    "PeerTimeoutError",
    "ReduceConfig",
    "ReduceError",
    "ReduceGroup",
    "ReduceOp",
    "SizeMismatchError",
    "UnsupportedPlatformError",
    "UnsupportedTensorError",
    "allreduce",
    "allreduce_coalesced",
    "destroy",
    "get_group",
    "init",
    "is_initialized",
    "remove_stale_segments",
]
