"""The node validator: a few steps, each bounded in time, that must pass before a node a fault
drained comes back into service (agent/health.py), run at agent start and on
``hfai admin validate NODE``.

On simulated GPUs the steps run the same harness on the simulated back end: a small matrix
product checked against a reference, a memory pattern written and read back, and a sum across the
GPUs; a GPU the simulation holds broken (an injected hardware fault) fails each of them. On real
GPUs (torch with CUDA) the matrix product and the memory pattern run on each GPU, and one process
per GPU all-reduces a buffer through hfreduce, whose bus bandwidth must reach a floor
(agent/health_allreduce.py). That step runs on simulated GPUs too when ``[agent]
health_allreduce`` is "always": two processes over CPU tensors (docs/health.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hfai.agent.gpu import GpuSource
from hfai.agent.health_allreduce import (
    ALLREDUCE_ALWAYS,
    ALLREDUCE_NEVER,
    SIMULATED_RANKS,
    AllreduceSettings,
    run_allreduce,
)
from hfai.core.daemon import bounded
from hfai.protocol.types import HealthCheck

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Measured:
    """A step's result with what it measured: what failed ('' : passed), and the bus bandwidth
    of the in-node all-reduce (GB/s; HealthCheck.bus_gbps)."""

    problem: str = ""
    bus_gbps: float = 0.0


@dataclass(frozen=True)
class Step:
    """One check: ``run`` returns what failed ('' : passed), or that with what it measured, and
    runs in a thread, at most ``timeout_s``."""

    name: str
    run: Callable[[], str | Measured]

#: The share of its bound a step that starts processes gives them: it ends them itself and says
#: which one did not answer, before the bound abandons it.
OWN_DEADLINE = 0.9


async def run_check(steps: Sequence[Step], timeout_s: float, now: Callable[[], float]) -> HealthCheck:
    """Run ``steps`` in order, each bounded by ``timeout_s``; the check passes if every one did.
    A step that overruns is abandoned (its thread finishes in the background) and fails."""
    began, failed, gbps = time.monotonic(), [], 0.0
    for step in steps:
        try:
            got = await bounded(asyncio.to_thread(step.run), timeout_s)
        except TimeoutError:
            got = f"took longer than {timeout_s:g} s"
        except Exception as e:  # a step's own error is its failure, not the agent's
            got = f"{type(e).__name__}: {e}"
        if isinstance(got, Measured):
            gbps = max(gbps, got.bus_gbps)
            got = got.problem
        if got:
            failed.append(f"{step.name}: {got}")
    return HealthCheck(ts=now(), ok=not failed, duration_s=time.monotonic() - began, detail="; ".join(failed),
                       bus_gbps=gbps)


def steps_for(gpus: GpuSource, allreduce: AllreduceSettings | None = None, step_s: float = 60.0) -> list[Step]:
    """The validator's steps for this node's GPU source (``allreduce``: the all-reduce step's
    settings; ``step_s``: each step's bound)."""
    allreduce = allreduce or AllreduceSettings()
    if gpus.injectable:
        return simulated_steps(gpus, allreduce, step_s)
    return torch_steps(allreduce, step_s)


def _matmul(a: list[list[float]], b: list[list[float]]) -> list[list[float]]:
    return [[sum(x * y for x, y in zip(row, col, strict=True)) for col in zip(*b, strict=True)] for row in a]


_N = 8
_A = [[float((i * _N + j) % 7 - 3) for j in range(_N)] for i in range(_N)]
_REFERENCE = _matmul(_A, _A)


def simulated_steps(gpus: GpuSource, allreduce: AllreduceSettings | None = None, step_s: float = 60.0) -> list[Step]:
    """The harness on simulated GPUs: each step "runs" on every GPU, and a broken one fails it.
    The all-reduce is a real one through hfreduce over CPU tensors when ``allreduce.mode`` is
    "always", else a sum in the agent."""
    allreduce = allreduce or AllreduceSettings()

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

    def summed() -> bool:
        n = len(gpus.sample(busy=False))
        return sum(float(i) for i in range(n)) == n * (n - 1) / 2

    in_agent = on_each(summed, "in-node sum wrong")

    def reduced() -> str | Measured:
        if gpus.broken() or allreduce.mode != ALLREDUCE_ALWAYS:
            return in_agent()  # a broken GPU fails it, as it fails the others
        return Measured(*run_allreduce(SIMULATED_RANKS, "cpu", allreduce, step_s * OWN_DEADLINE))

    return [Step("gemm", on_each(gemm, "matrix product differs from the reference")),
            Step("memory", on_each(memory, "memory pattern read back wrong")),
            Step("allreduce", reduced)]


def torch_steps(allreduce: AllreduceSettings | None = None, step_s: float = 60.0) -> list[Step]:
    """The steps on real GPUs: a GEMM on each GPU against a CPU reference, a memory pattern, and
    (unless ``allreduce.mode`` is "never") the all-reduce among one process per GPU. None without
    torch and CUDA (the check then passes on what NVML says alone)."""
    allreduce = allreduce or AllreduceSettings()
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

    def reduced() -> Measured:
        return Measured(*run_allreduce(torch.cuda.device_count(), "cuda", allreduce, step_s * OWN_DEADLINE))

    steps = [Step("gemm", gemm), Step("memory", memory)]
    return steps if allreduce.mode == ALLREDUCE_NEVER else [*steps, Step("allreduce", reduced)]
