"""The validator's in-node all-reduce through hfreduce (issue 35 §3; agent/health_allreduce.py):
the verdict (pure), then real ranks over CPU tensors on simulated GPUs: a pass with its bus
bandwidth, a floor it does not reach, an injected hardware fault, a step out of time. Each run
starts two torch processes (seconds)."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from hfai.agent.gpu import SimulatedGpus
from hfai.agent.health import GpuSignal, HealthState, Signal
from hfai.agent.health_allreduce import AllreduceSettings, RankResult, bus_gbps, judge, run_allreduce
from hfai.agent.health_watch import HealthWatch
from hfai.core.clock import FakeClock
from hfai.core.config import AgentConfig

MIB = 2**20


def test_bus_bandwidth_is_nccl_tests_measure():
    assert bus_gbps(10**9, 2, 1.0) == 1.0  # 2 (n - 1) / n = 1
    assert bus_gbps(10**9, 8, 1.0) == 1.75
    assert bus_gbps(10**9, 1, 1.0) == 0.0 and bus_gbps(10**9, 4, 0.0) == 0.0


def test_the_verdict_names_each_failed_rank_else_the_floor_timed_on_the_slowest_rank():
    ok = [RankResult(0, seconds=0.5), RankResult(1, seconds=1.0)]
    assert judge(ok, 2, 10**9, floor_gbps=1.0) == ("", 1.0)
    problem, gbps = judge(ok, 2, 10**9, floor_gbps=1.5)
    assert gbps == 1.0 and problem.startswith("bus bandwidth 1.00 GB/s among 2 ranks, below the floor of 1.5 GB/s")
    problem, gbps = judge([RankResult(0, error="PeerDiedError: rank 1 died")], 2, 10**9, 0.0)
    assert gbps == 0.0 and problem == "GPU 0: PeerDiedError: rank 1 died; GPU 1: its rank did not report"
    assert judge([RankResult(0, seconds=1.0), RankResult(1, error="x")], 2, 10**9, 0.0, "rank")[0] == "rank 1: x"


def test_the_mode_is_checked_and_the_agent_config_carries_the_settings():
    with pytest.raises(ValueError, match="health_allreduce must be one of gpus, always, never"):
        AllreduceSettings(mode="sometimes")
    ac = AgentConfig()
    assert (ac.health_allreduce, ac.health_allreduce_floor_gbps, ac.health_allreduce_bytes) == ("gpus", 1.0, 64 * MIB)


def _watch(gpus: SimulatedGpus, floor_gbps: float, step_s: float = 120.0) -> HealthWatch:
    settings = AllreduceSettings(mode="always", floor_gbps=floor_gbps, nbytes=4 * MIB, rounds=2)
    return HealthWatch("n1", gpus, 1.0, step_s, FakeClock(wall_offset=1.75e9), changed=lambda: None,
                       runs=lambda: [], publish=lambda ev: asyncio.sleep(0, True), allreduce=settings)


@pytest.mark.slow
def test_on_simulated_gpus_the_all_reduce_runs_through_hfreduce_and_its_bandwidth_is_recorded():
    w = _watch(SimulatedGpus(), floor_gbps=0.001)
    reply = asyncio.run(w.validate())
    assert reply.check.ok, reply.check.detail
    assert reply.check.bus_gbps > 0 and "GB/s bus bandwidth" in reply.message
    print(f"\nhfreduce, 2 ranks over CPU tensors, 4 MiB: {reply.check.bus_gbps:.2f} GB/s bus bandwidth")


@pytest.mark.slow
def test_a_node_below_the_floor_fails_the_check_and_drains():
    w = _watch(SimulatedGpus(), floor_gbps=1e6)
    reply = asyncio.run(w.validate())
    assert not reply.check.ok and reply.check.bus_gbps > 0
    assert reply.check.detail.startswith("allreduce: bus bandwidth ") and "below the floor of 1e+06 GB/s" in \
        reply.check.detail, reply.check.detail
    assert w.health.state is HealthState.FAULTED and "health check failed: allreduce" in w.drain_reason()


def test_an_injected_hardware_fault_fails_the_all_reduce_step_as_the_others():
    gpus = SimulatedGpus()
    gpus.inject(GpuSignal(Signal.XID, 3, xid=74))
    w = _watch(gpus, floor_gbps=0.0)
    reply = asyncio.run(w.validate())
    failed = dict(part.split(": ", 1) for part in reply.check.detail.split("; ") if part.split(": ")[0] in
                  ("gemm", "memory", "allreduce"))
    assert set(failed) == {"gemm", "memory", "allreduce"} and failed["allreduce"].startswith("GPU 3: "), failed


@pytest.mark.slow
def test_ranks_that_do_not_answer_within_the_step_are_ended_and_named():
    # 50 ms: no interpreter gets torch imported by then; every rank is named and killed.
    problem, gbps = run_allreduce(2, "cpu", AllreduceSettings(nbytes=MIB), timeout_s=0.05)
    assert (problem, gbps) == ("rank 0: no result within 0.05 s; rank 1: no result within 0.05 s", 0.0)


def test_the_validator_on_simulated_gpus_imports_no_torch_unless_asked():
    code = ("import asyncio, sys\n"
            "from hfai.agent.gpu import SimulatedGpus\n"
            "from hfai.agent.health_check import run_check, steps_for\n"
            "import hfai.agent.service\n"
            "check = asyncio.run(run_check(steps_for(SimulatedGpus()), 10.0, lambda: 0.0))\n"
            "print(check.ok, 'torch' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True", "False"]


def test_hfai_nodes_and_the_nodes_page_show_the_measured_bandwidth():
    from hfai.cli import render
    from hfai.protocol.types import HealthCheck, NodeInfo, NodeRecord, NodeState
    from hfai.web import views

    record = NodeRecord(name="n0", group="g", address="x", ts=1.75e9, seq=1,
                        check=HealthCheck(ts=1.75e9, ok=True, duration_s=3.0, bus_gbps=6.1))
    assert views.node_health(record).endswith("(all-reduce 6.10 GB/s)")
    info = NodeInfo(record=record, state=NodeState.UP, age_s=1.0)
    assert render.node_json(info)["check"]["bus_gbps"] == 6.1
