"""``hfai.distributed``: everything ``torch.distributed`` has, plus the platform's helpers.

``import hfai.distributed as dist`` works wherever ``torch.distributed`` did. The platform sets
``WORLD_SIZE`` (nodes), ``RANK`` (node index), ``MASTER_ADDR`` and ``MASTER_PORT``; inside a node a
job usually starts one worker per GPU with :func:`hfai.multiprocessing.spawn`. :func:`setup`
turns that into a process group of ``nodes * workers`` ranks.
"""

from __future__ import annotations

import enum
import os
from typing import Any


class HFAI_NCCL_OPT_LEVEL(enum.Enum):  # noqa: N801 - the original client's spelling
    """NCCL tuning levels of the original client's ``set_nccl_opt_level``.

    ``AUTO`` is the one the public scripts pass (and the only one attested there): let the
    platform tune NCCL for the cluster's network. Here NCCL keeps its own defaults and the
    operator's ``NCCL_*`` settings; see :func:`set_nccl_opt_level`."""

    AUTO = "auto"


def set_nccl_opt_level(level: HFAI_NCCL_OPT_LEVEL) -> None:
    """Accepted for the original client's scripts; NCCL is left as it is configured.

    The original switched on its own tuned NCCL build and settings for the Fire-Flyer network.
    This platform does not ship one: NCCL reads the ``NCCL_*`` environment the operator or the
    job sets, which ``AUTO`` leaves untouched. Anything but a member of
    :class:`HFAI_NCCL_OPT_LEVEL` is refused (``TypeError``), so a typo does not pass silently."""
    if not isinstance(level, HFAI_NCCL_OPT_LEVEL):
        raise TypeError(f"set_nccl_opt_level takes a member of hfai.distributed.HFAI_NCCL_OPT_LEVEL "
                        f"({', '.join(m.name for m in HFAI_NCCL_OPT_LEVEL)}), got {level!r}")


def __getattr__(name: str) -> Any:
    import torch.distributed

    return getattr(torch.distributed, name)


def node_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def node_count() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def setup(local_rank: int = 0, workers_per_node: int = 1, backend: str | None = None, timeout_s: float = 600.0):
    """Initialise the default process group for worker ``local_rank`` of this node; returns (rank, world).

    Rank = node_rank * workers_per_node + local_rank. Backend: nccl with CUDA, else gloo.
    """
    import datetime

    import torch
    import torch.distributed as dist

    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    rank = node_rank() * workers_per_node + local_rank
    world = node_count() * workers_per_node
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    return rank, world


def receive_suspend_command(timeout: float = 500, raise_exception: bool = False) -> bool:
    """The suspend flag, agreed by all ranks: True on every rank iff any rank saw it.

    A collective (all-reduce MAX of one integer): every rank must call it at the same step; a
    script that asks on rank 0 only wants :func:`hfai.client.receive_suspend_command`.
    Without an initialised process group it is the plain local flag. ``timeout`` and
    ``raise_exception`` are the original client's, checked and without effect here.
    """
    import torch
    import torch.distributed as dist

    from hfai._job import _check_request_args, _local_flag

    _check_request_args("receive_suspend_command", timeout, raise_exception)
    flag = _local_flag()
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
