"""The health code on real GPUs (issue 35 §2-3): NVML read for real (test_health_agent.py fakes
it), the validator's steps on the GPUs with its results printed, and hfreduce's all-reduce over
CUDA tensors. bench/gpu_check.sh runs this on a GPU machine; elsewhere every test skips.

Needs only torch, msgpack and pynvml (nvidia-ml-py) besides hfai: no NATS, no agent service."""

from __future__ import annotations

import asyncio
import time

import pytest

# Without msgpack (a bare GPU machine's Python) hfai's protocol types do not import: skip, saying why.
pytest.importorskip("msgpack", reason="hfai's health code needs msgpack: see the top of bench/gpu_check.sh")

from hfai.agent.health import GpuSignal  # noqa: E402
from hfai.agent.health_allreduce import AllreduceSettings, run_allreduce  # noqa: E402
from hfai.agent.health_check import run_check, torch_steps  # noqa: E402
from hfai.protocol.errors import InvalidRequest  # noqa: E402

#: Each step's bound here: generous, a first CUDA context and kernel loads take seconds.
STEP_S = 180.0


@pytest.fixture(scope="module")
def nvml():
    from hfai.agent.gpu import open_gpu_source

    try:
        src = open_gpu_source("nvml")
    except InvalidRequest as e:
        pytest.skip(f"no real NVML here: {e}")
    yield src
    src.close()


def _cuda():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA here")
    return torch


def test_nvml_reads_every_gpu_and_polls_its_signals(nvml):
    stats = nvml.sample(busy=False)
    for g in stats:
        print(f"\nGPU {g.index}: {g.name}, {g.memory_used / 2**30:.1f}/{g.memory_total / 2**30:.1f} GiB, "
              f"{g.temperature:.0f} C, {g.power_w:.0f} W, ECC {g.ecc_errors}")
    assert stats and all(g.memory_total > 0 for g in stats)
    seen = [s for _ in range(3) for s in nvml.signals()]  # Xid events (NVML's event set) and polled conditions
    print(f"signals over 3 polls: {seen or 'none'}")
    assert all(isinstance(s, GpuSignal) and 0 <= s.gpu < len(stats) for s in seen)
    assert nvml.broken() == {}, nvml.broken()  # a lost GPU: this machine is not fit to test on


def test_the_validator_passes_on_these_gpus_and_prints_its_results():
    torch = _cuda()
    steps = torch_steps(AllreduceSettings(floor_gbps=0.1), step_s=STEP_S)
    assert [s.name for s in steps] == ["gemm", "memory", "allreduce"]
    check = asyncio.run(run_check(steps, STEP_S, time.time))
    n = torch.cuda.device_count()
    print(f"\nvalidator on {n} GPU(s): {'passed' if check.ok else 'FAILED'} in {check.duration_s:.2f} s; "
          f"all-reduce {check.bus_gbps:.2f} GB/s bus bandwidth{' (one GPU: none to run)' if n < 2 else ''}; "
          f"{check.detail or 'no failures'}")
    assert check.ok, check.detail


def test_hfreduce_all_reduces_cuda_tensors_among_ranks_even_on_one_gpu():
    _cuda()
    problem, gbps = run_allreduce(2, "cuda", AllreduceSettings(floor_gbps=0.0), STEP_S)
    print(f"\nhfreduce, 2 ranks over CUDA tensors, 64 MiB: {gbps:.2f} GB/s bus bandwidth")
    assert problem == "" and gbps > 0


def test_a_floor_no_node_reaches_fails_the_step_on_real_gpus():
    _cuda()
    problem, gbps = run_allreduce(2, "cuda", AllreduceSettings(floor_gbps=1e6, nbytes=8 * 2**20), STEP_S)
    assert gbps > 0 and "below the floor of 1e+06 GB/s" in problem, problem
