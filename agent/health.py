"""What a GPU signal means for the node and its jobs: one pure classification, and the node's
health as the agent keeps it.

The GPU source (agent/gpu.py: NVML or simulated) turns what it sees into :class:`GpuSignal`\\ s:
NVML's Xid critical-error events, and what it polls (the uncorrectable ECC count grew, retired
pages wait for a reset, the GPU is lost, the clocks are throttled for heat or power).
:func:`classify` says what each one is:

* HARDWARE: the GPU or its links are faulty. The node drains itself with the fault as its reason,
  its runs are interrupted as a platform fault (requeued, never the user's failure) and it comes
  back only after a health check passes or an operator forces it (:class:`NodeHealth`).
* APPLICATION: the job did it (an illegal address, an exception in its kernel). Recorded in the
  job's history; the node stays in service.
* WARN: worth a line in the node's fault list and nothing more (throttling, an Xid we do not know).

The table is documented in docs/health.md; tests/test_health_classify.py pins it.
"""

from __future__ import annotations

import enum
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from hfai.protocol import reasons
from hfai.protocol.types import GpuFault, HealthCheck


class FaultClass(enum.Enum):
    HARDWARE = "hardware"
    APPLICATION = "application"
    WARN = "warn"


class Signal(enum.Enum):
    """What a GPU source reports: an Xid event, or a polled condition that newly holds."""

    XID = "xid"
    DBE = "dbe"  # the volatile uncorrectable (double-bit) ECC count grew
    RETIRED = "retired"  # retired pages pending: the GPU needs a reset to retire them
    LOST = "lost"  # NVML answers "GPU is lost" (fallen off the bus, no longer reachable)
    THERMAL = "thermal"  # clocks throttled for heat (hardware or software slowdown)
    POWER = "power"  # clocks throttled for power (power brake, power cap)


@dataclass(frozen=True)
class GpuSignal:
    """One thing a GPU source saw on GPU ``gpu`` (``xid`` for Signal.XID; ``detail``: figures,
    such as the ECC count before and after)."""

    signal: Signal
    gpu: int
    xid: int = 0
    detail: str = ""


#: Xid -> (class, meaning). From NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors) and
#: what large training fleets drain nodes for (the Fire-Flyer AI-HPC paper, Llama 3's report).
XIDS: dict[int, tuple[FaultClass, str]] = {
    13: (FaultClass.APPLICATION, "graphics engine exception (an illegal instruction or address in the job's kernel)"),
    31: (FaultClass.APPLICATION, "GPU memory page fault (the job accessed an illegal address)"),
    43: (FaultClass.APPLICATION, "GPU stopped processing the job's channel (the job's fault)"),
    45: (FaultClass.WARN, "preemptive clean-up after an earlier error"),
    48: (FaultClass.HARDWARE, "double-bit ECC error"),
    63: (FaultClass.HARDWARE, "ECC page retirement or row remapping event"),
    64: (FaultClass.HARDWARE, "ECC page retirement or row remapping failure"),
    74: (FaultClass.HARDWARE, "NVLink error"),
    79: (FaultClass.HARDWARE, "fell off the bus"),
    92: (FaultClass.HARDWARE, "high single-bit ECC error rate"),
    94: (FaultClass.HARDWARE, "contained ECC error (the GPU needs a reset)"),
    95: (FaultClass.HARDWARE, "uncontained ECC error"),
    119: (FaultClass.HARDWARE, "GSP RPC timeout"),
    120: (FaultClass.HARDWARE, "GSP error"),
}

#: What a polled signal means (every one but Xid).
POLLED: dict[Signal, tuple[FaultClass, str]] = {
    Signal.DBE: (FaultClass.HARDWARE, "uncorrectable ECC errors"),
    Signal.RETIRED: (FaultClass.HARDWARE, "retired memory pages pending (the GPU needs a reset)"),
    Signal.LOST: (FaultClass.HARDWARE, "GPU is lost (NVML cannot reach it)"),
    Signal.THERMAL: (FaultClass.WARN, "clocks throttled: too hot"),
    Signal.POWER: (FaultClass.WARN, "clocks throttled: power brake or cap"),
}

UNKNOWN_XID = "Xid not in hfai's table: recorded, the node stays in service"


def classify(s: GpuSignal, ts: float = 0.0) -> tuple[FaultClass, GpuFault]:
    """Pure: the class of ``s`` and the fault record that names it (at time ``ts``)."""
    if s.signal is Signal.XID:
        klass, meaning = XIDS.get(s.xid, (FaultClass.WARN, UNKNOWN_XID))
    else:
        klass, meaning = POLLED[s.signal]
    if s.detail:
        meaning = f"{meaning} ({s.detail})"
    xid = s.xid if s.signal is Signal.XID else None
    why = reasons.gpu_fault(gpu=s.gpu, meaning=meaning, kind=klass.value, xid=xid)
    return klass, GpuFault(ts=ts, why=why, hardware=klass is FaultClass.HARDWARE)


class HealthState(enum.Enum):
    """The node's health as its agent keeps it.

    HEALTHY -> FAULTED (a hardware fault) -> HEALTHY (a health check passed after it, or an
    operator forced it back). While FAULTED the node is drained and further faults are only listed.
    """

    HEALTHY = "healthy"
    FAULTED = "faulted"


#: How many faults a node's heartbeat lists (newest last).
FAULT_HISTORY = 8


class NodeHealth:
    """The node's hardware fault (None: healthy), its latest faults, its last check, and how
    many of each Xid it saw (for Prometheus). No I/O, no clock: callers pass the time."""

    def __init__(self) -> None:
        self.fault: GpuFault | None = None
        self.faults: deque[GpuFault] = deque(maxlen=FAULT_HISTORY)
        self.check: HealthCheck | None = None
        self.xids: Counter[int] = Counter()

    @property
    def state(self) -> HealthState:
        return HealthState.HEALTHY if self.fault is None else HealthState.FAULTED

    def observe(self, signals: Iterable[GpuSignal], now: float) -> list[GpuFault]:
        """Take in what the GPU source saw; returns the faults, in order. The first hardware
        fault drains the node (later ones are only listed)."""
        out = []
        for s in signals:
            klass, fault = classify(s, now)
            if s.signal is Signal.XID:
                self.xids[s.xid] += 1
            self.faults.append(fault)
            if klass is FaultClass.HARDWARE and self.fault is None:
                self.fault = fault
            out.append(fault)
        return out

    def checked(self, check: HealthCheck) -> None:
        """A validator run ended: a passing one puts a faulted node back in service, a failing
        one drains a healthy node (the failure is its fault)."""
        self.check = check
        if check.ok and self.fault is not None and check.ts >= self.fault.ts:
            self.fault = None
        elif not check.ok and self.fault is None:
            self.fault = GpuFault(ts=check.ts, why=reasons.text(text=f"health check failed: {check.detail}"),
                                  hardware=True)
            self.faults.append(self.fault)

    def undrain(self, node: str, force: bool) -> str:
        """Put a faulted node back if allowed (see :func:`undrain_refusal`); returns the refusal
        ('' when done)."""
        why = undrain_refusal(node, self.fault, self.check, force)
        if not why:
            self.fault = None
        return why

    def drain_reason(self, node: str) -> str:
        """The node's drain reason while faulted ('' when healthy): says it was a fault, and how back."""
        if self.fault is None:
            return ""
        return f"GPU fault: {self.fault.text()} (back after hfai admin validate {node} passes)"


def undrain_refusal(node: str, fault: GpuFault | None, check: HealthCheck | None, force: bool) -> str:
    """Pure: why node ``node``, drained by ``fault``, may not come back yet ('' : it may): no
    health check passed since the fault, and the operator did not force it."""
    if fault is None or force or (check is not None and check.ok and check.ts >= fault.ts):
        return ""
    last = "no health check has run" if check is None else (
        "the last health check failed" if not check.ok else "no health check has passed since")
    return (f"node {node} was drained by a fault ({fault.text()}) and {last}: run hfai admin validate {node}, "
            "or undrain it with --force")
