"""The node validator: a few steps, each bounded in time, that must pass before a node a fault
drained comes back into service (agent/health.py), run at agent start and on
``hfai admin validate NODE``.

On simulated GPUs the steps run the same harness on the simulated back end: a small matrix
product checked against a reference, a memory pattern written and read back, and a sum across the
GPUs; a GPU the simulation holds broken (an injected hardware fault) fails each of them. On real
GPUs (torch with CUDA) the matrix product and the memory pattern run on each GPU; the in-node
all-reduce through hfreduce with a bandwidth floor is not written yet (docs/health.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hfai._daemon import bounded
from hfai.agent.gpu import GpuSource
from hfai.protocol.types import HealthCheck

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Step:
    """One check: ``run`` returns what failed ('' : passed) and runs in a thread, at most
    ``timeout_s``."""

    name: str
    run: Callable[[], str]


async def run_check(steps: Sequence[Step], timeout_s: float, now: Callable[[], float]) -> HealthCheck:
    """Run ``steps`` in order, each bounded by ``timeout_s``; the check passes if every one did.
    A step that overruns is abandoned (its thread finishes in the background) and fails."""
    began, failed = time.monotonic(), []
    for step in steps:
        try:
            problem = await bounded(asyncio.to_thread(step.run), timeout_s)
        except TimeoutError:
            problem = f"took longer than {timeout_s:g} s"
        except Exception as e:  # a step's own error is its failure, not the agent's
            problem = f"{type(e).__name__}: {e}"
        if problem:
            failed.append(f"{step.name}: {problem}")
    return HealthCheck(ts=now(), ok=not failed, duration_s=time.monotonic() - began, detail="; ".join(failed))


def steps_for(gpus: GpuSource) -> list[Step]:
    """The validator's steps for this node's GPU source."""
    if gpus.injectable:
        return simulated_steps(gpus)
    return torch_steps()


def _matmul(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    return [[sum(x * y for x, y in zip(row, col, strict=True)) for col in zip(*b, strict=True)] for row in a]


_N = 8
_A = [[float((i * _N + j) % 7 - 3) for j in range(_N)] for i in range(_N)]
_REFERENCE = _matmul(_A, _A)


def simulated_steps(gpus: GpuSource) -> list[Step]:
    """The harness on simulated GPUs: each step "runs" on every GPU, and a broken one fails it."""

    def on_each(what: Callable[[], bool], failure: str) -> Callable[[], str]:
        def run() -> str:
            broken = gpus.broken()
            bad = [f"GPU {i}: {failure} ({broken[i]})" for i in sorted(broken)]
            if not bad and not what():
                bad.append(failure)
            return "; ".join(bad)

        return run

    def gemm() -> bool:
        return _matmul(_A, _A) == _REFERENCE

    def memory() -> bool:
        buf = bytearray(b"\xa5\x5a" * 4096)
        return buf == bytes(b"\xa5\x5a" * 4096)

    def allreduce() -> bool:
        n = len(gpus.sample(busy=False))
        return sum(float(i) for i in range(n)) == n * (n - 1) / 2

    return [Step("gemm", on_each(gemm, "matrix product differs from the reference")),
            Step("memory", on_each(memory, "memory pattern read back wrong")),
            Step("allreduce", on_each(allreduce, "in-node sum wrong"))]


def torch_steps() -> list[Step]:
    """The steps on real GPUs: a GEMM on each GPU against a CPU reference, and a memory pattern.
    None without torch and CUDA (the check then passes on what NVML says alone)."""
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []

    def gemm() -> str:
        a = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(0))
        ref = a @ a
        bad = []
        for i in range(torch.cuda.device_count()):
            got = (a.to(f"cuda:{i}") @ a.to(f"cuda:{i}")).cpu()
            if not torch.allclose(got, ref, rtol=1e-3, atol=1e-2):  # TF32 and summation order differ
                bad.append(f"GPU {i}: GEMM differs from the CPU reference by {float((got - ref).abs().max()):.3g}")
        return "; ".join(bad)

    def memory() -> str:
        bad = []
        for i in range(torch.cuda.device_count()):
            pattern = torch.full((64 << 20,), 0xA5, dtype=torch.uint8, device=f"cuda:{i}")
            if not bool((pattern ^ 0xA5).eq(0).all()):
                bad.append(f"GPU {i}: memory pattern read back wrong")
        return "; ".join(bad)

    return [Step("gemm", gemm), Step("memory", memory)]
