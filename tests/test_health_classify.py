"""The classification of GPU signals (agent/health.py) as a table, the node's health as its agent
keeps it, and that docs/health.md documents the same table."""

from __future__ import annotations

from pathlib import Path

import pytest

from hfai.agent.health import (
    XIDS,
    FaultClass,
    GpuSignal,
    HealthState,
    NodeHealth,
    Signal,
    classify,
    undrain_refusal,
)
from hfai.protocol.types import HealthCheck

H, A, W = FaultClass.HARDWARE, FaultClass.APPLICATION, FaultClass.WARN
ROOT = Path(__file__).resolve().parent.parent

#: (signal, what the node's reason or the job's history says, class)
TABLE = [
    (GpuSignal(Signal.XID, 3, xid=79), "Xid 79 on GPU 3: fell off the bus", H),
    (GpuSignal(Signal.XID, 0, xid=48), "Xid 48 on GPU 0: double-bit ECC error", H),
    (GpuSignal(Signal.XID, 1, xid=63), "Xid 63 on GPU 1: ECC page retirement or row remapping event", H),
    (GpuSignal(Signal.XID, 1, xid=64), "Xid 64 on GPU 1: ECC page retirement or row remapping failure", H),
    (GpuSignal(Signal.XID, 7, xid=74), "Xid 74 on GPU 7: NVLink error", H),
    (GpuSignal(Signal.XID, 2, xid=92), "Xid 92 on GPU 2: high single-bit ECC error rate", H),
    (GpuSignal(Signal.XID, 2, xid=94), "Xid 94 on GPU 2: contained ECC error (the GPU needs a reset)", H),
    (GpuSignal(Signal.XID, 2, xid=95), "Xid 95 on GPU 2: uncontained ECC error", H),
    (GpuSignal(Signal.XID, 5, xid=119), "Xid 119 on GPU 5: GSP RPC timeout", H),
    (GpuSignal(Signal.XID, 5, xid=120), "Xid 120 on GPU 5: GSP error", H),
    (GpuSignal(Signal.LOST, 4), "GPU 4: GPU is lost (NVML cannot reach it)", H),
    (GpuSignal(Signal.DBE, 6, detail="count 0 -> 2"), "GPU 6: uncorrectable ECC errors (count 0 -> 2)", H),
    (GpuSignal(Signal.RETIRED, 6), "GPU 6: retired memory pages pending (the GPU needs a reset)", H),
    (GpuSignal(Signal.XID, 0, xid=13),
     "Xid 13 on GPU 0: graphics engine exception (an illegal instruction or address in the job's kernel)", A),
    (GpuSignal(Signal.XID, 0, xid=31), "Xid 31 on GPU 0: GPU memory page fault (the job accessed an illegal address)",
     A),
    (GpuSignal(Signal.XID, 0, xid=43), "Xid 43 on GPU 0: GPU stopped processing the job's channel (the job's fault)",
     A),
    (GpuSignal(Signal.XID, 0, xid=45), "Xid 45 on GPU 0: preemptive clean-up after an earlier error", W),
    (GpuSignal(Signal.THERMAL, 1), "GPU 1: clocks throttled: too hot", W),
    (GpuSignal(Signal.POWER, 1), "GPU 1: clocks throttled: power brake or cap", W),
    (GpuSignal(Signal.XID, 0, xid=999), "Xid 999 on GPU 0: Xid not in hfai's table: recorded, the node stays in "
                                        "service", W),
]


@pytest.mark.parametrize(("signal", "text", "klass"), TABLE, ids=[t[1][:24] for t in TABLE])
def test_each_signal_is_classified_with_a_reason_that_names_it(signal, text, klass):
    got, fault = classify(signal, ts=5.0)
    assert (got, fault.text(), fault.hardware, fault.ts) == (klass, text, klass is H, 5.0)


def test_in_a_jobs_history_the_reason_names_the_node_and_what_it_means():
    from hfai.protocol.reasons import Reason

    _, fault = classify(GpuSignal(Signal.XID, 0, xid=13))
    line = Reason(fault.why.code, {**fault.why.params, "node": "node-1"}).text()
    assert line.startswith("Xid 13 on GPU 0 of node-1: ") and line.endswith("(the job's own error: the node stays in "
                                                                              "service)")


def test_the_issue_lists_hardware_and_application_xids():
    assert {x for x, (k, _) in XIDS.items() if k is H} == {48, 63, 64, 74, 79, 92, 94, 95, 119, 120}
    assert {x for x, (k, _) in XIDS.items() if k is A} == {13, 31, 43}


def test_docs_table_matches_the_code():
    doc = (ROOT / "docs" / "health.md").read_text()
    for xid, (klass, meaning) in XIDS.items():
        assert f"| {xid} | {klass.value} | {meaning} |" in doc, xid


def test_the_first_hardware_fault_drains_the_node_and_an_application_one_does_not():
    h = NodeHealth()
    h.observe([GpuSignal(Signal.XID, 0, xid=13), GpuSignal(Signal.THERMAL, 2)], now=1.0)
    assert h.state is HealthState.HEALTHY and h.drain_reason("n1") == ""
    h.observe([GpuSignal(Signal.XID, 3, xid=79), GpuSignal(Signal.XID, 1, xid=74)], now=2.0)
    assert h.state is HealthState.FAULTED
    assert h.drain_reason("n1") == ("GPU fault: Xid 79 on GPU 3: fell off the bus (back after hfai admin validate n1 "
                                    "passes)")
    assert [f.text()[:6] for f in h.faults] == ["Xid 13", "GPU 2:", "Xid 79", "Xid 74"]
    assert h.xids == {13: 1, 79: 1, 74: 1}


def test_a_passing_check_after_the_fault_puts_the_node_back_and_a_failing_one_drains_it():
    h = NodeHealth()
    h.checked(HealthCheck(ts=1.0, ok=False, detail="gemm: GPU 2: wrong"))
    assert h.state is HealthState.FAULTED and "health check failed: gemm: GPU 2: wrong" in h.drain_reason("n")
    h.checked(HealthCheck(ts=2.0, ok=True))
    assert h.state is HealthState.HEALTHY
    h.observe([GpuSignal(Signal.LOST, 0)], now=3.0)
    h.checked(HealthCheck(ts=2.5, ok=True))  # a check that began before the fault proves nothing
    assert h.state is HealthState.FAULTED


def test_undrain_asks_for_force_without_a_passing_check():
    _, fault = classify(GpuSignal(Signal.XID, 3, xid=79), ts=10.0)
    refusal = undrain_refusal("n1", fault, None, force=False)
    assert refusal == ("node n1 was drained by a fault (Xid 79 on GPU 3: fell off the bus) and no health check has "
                       "run: run hfai admin validate n1, or undrain it with --force")
    assert "the last health check failed" in undrain_refusal("n1", fault, HealthCheck(ts=11.0, ok=False), False)
    assert "no health check has passed since" in undrain_refusal("n1", fault, HealthCheck(ts=9.0, ok=True), False)
    assert undrain_refusal("n1", fault, HealthCheck(ts=11.0, ok=True), False) == ""
    assert undrain_refusal("n1", fault, None, force=True) == ""
    h = NodeHealth()
    h.observe([GpuSignal(Signal.XID, 3, xid=79)], now=10.0)
    assert h.undrain("n1", force=False) and h.state is HealthState.FAULTED
    assert h.undrain("n1", force=True) == "" and h.state is HealthState.HEALTHY
