"""``hfai.distributed``: everything ``torch.distributed`` has, plus the platform's helpers.

``import hfai.distributed as dist`` works wherever ``torch.distributed`` did. The platform sets
``WORLD_SIZE`` (nodes), ``RANK`` (node index), ``MASTER_ADDR`` and ``MASTER_PORT``; inside a node a
job usually starts one worker per GPU with :func:`hfai.multiprocessing.spawn`. :func:`setup`
turns that into a process group of ``nodes * workers`` ranks.
"""

from __future__ import annotations

import os
from typing import Any


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


def receive_suspend_command() -> bool:
    """The suspend flag, agreed by all ranks: True on every rank iff any rank saw it.

    A collective (all-reduce MAX of one integer): every rank must call it at the same step.
    Without an initialised process group it is the plain local flag.
    """
    import torch
    import torch.distributed as dist

    from hfai._job import receive_suspend_command as local_flag

    flag = local_flag()
    if not (dist.is_available() and dist.is_initialized()):
        return flag
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    t = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())
