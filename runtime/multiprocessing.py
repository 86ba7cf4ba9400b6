"""``hfai.multiprocessing.spawn``: one worker process per GPU, torch's calling convention.

``spawn(fn, args=(), nprocs=N)`` calls ``fn(local_rank, *args)`` in N processes and waits for
them; an exception in one worker is raised in the parent. It defers to
``torch.multiprocessing.spawn`` (imported only when called, so ``import hfai`` stays light).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def default_nprocs() -> int:
    """GPUs visible to this process, or 1 on a CPU-only machine."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int | None = None, join: bool = True, daemon: bool = False,
          start_method: str = "spawn"):
    import torch.multiprocessing as tmp

    return tmp.start_processes(fn, args=args, nprocs=nprocs or default_nprocs(), join=join, daemon=daemon,
                               start_method=start_method)
