"""``hfai.multiprocessing.spawn``: one worker process per GPU, torch's calling convention.

``spawn(fn, args=(), nprocs=N)`` calls ``fn(local_rank, *args)`` in N processes and waits for
them; an exception in one worker is raised in the parent (torch then stops the others). It defers
to ``torch.multiprocessing.start_processes`` (imported only when called, so ``import hfai``
stays light). ``bind_numa=True`` (the default, as in the original client) binds each worker's CPU
affinity to its GPU's NUMA node first: see :mod:`hfai.numa`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hfai import numa


def default_nprocs() -> int:
    """GPUs visible to this process, or 1 on a CPU-only machine."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 1


def spawn(fn: Callable[..., Any], args: tuple = (), nprocs: int | None = None, join: bool = True, daemon: bool = False,
          start_method: str = "spawn", bind_numa: bool = True):
    """Start ``nprocs`` workers ``fn(local_rank, *args)``; with ``join`` wait for them all.

    ``bind_numa``: on a host with several NUMA nodes, pin local rank i to the CPUs of the NUMA
    node of its GPU (the i-th visible one), or, without GPU information, to its block of the
    host's NUMA nodes. On a single-node host it changes nothing."""
    import torch.multiprocessing as tmp

    n = nprocs or default_nprocs()
    if bind_numa:
        plan = numa.plan_for_this_host(n)
        if any(cpus is not None for cpus in plan):
            fn, args = _bound, (fn, tuple(plan), *args)
    return tmp.start_processes(fn, args=args, nprocs=n, join=join, daemon=daemon, start_method=start_method)


def _bound(local_rank: int, fn: Callable[..., Any], plan: tuple[numa.CpuSet | None, ...], *args: Any) -> Any:
    """A worker's first step under ``bind_numa``: take its CPU set, then run the user's function."""
    numa.apply(plan[local_rank])
    return fn(local_rank, *args)
