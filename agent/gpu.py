"""GPU telemetry and health sources behind one small interface: NVML (real) and simulated (no GPU here).

``open_gpu_source("auto")`` tries NVML and falls back to the simulated source when the NVML
library is absent, as on a laptop or CI machine; "nvml" insists, "sim" forces the simulation.

Besides readings (:meth:`GpuSource.sample`), a source reports what its GPUs went through since it
was last asked (:meth:`GpuSource.signals`): NVML's Xid critical-error events and the conditions it
polls that newly hold; agent/health.py says what they mean. The simulated source takes injected
faults instead (``hfai admin fault``), so the whole path runs on machines without GPUs; a GPU
given a hardware fault stays broken, failing the node validator, until the faults are cleared.
"""

from __future__ import annotations

import logging
import math
from typing import Protocol

from hfai.agent.health import FaultClass, GpuSignal, Signal, classify
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import GPUS_PER_NODE, GpuStat

log = logging.getLogger(__name__)


class GpuSource(Protocol):
    name: str
    #: Whether faults can be injected (:class:`SimulatedGpus` only; never real GPUs).
    injectable: bool

    def sample(self, busy: bool) -> tuple[GpuStat, ...]:
        """One reading per GPU. ``busy`` says whether a job runs here (used by the simulation only)."""

    def signals(self) -> list[GpuSignal]:
        """What happened to the GPUs since the last call (events, and polled conditions that
        newly hold); never blocks."""

    def broken(self) -> dict[int, str]:
        """GPU index -> why it cannot be used now (the validator's ground truth on simulated
        GPUs; real GPUs are tested by running work on them)."""

    def close(self) -> None: ...


class SimulatedGpus:
    """Eight H100-like GPUs whose load follows whether a job is running on the node."""

    name = "sim"
    injectable = True
    MEMORY = 80 * 1024**3

    def __init__(self, count: int = GPUS_PER_NODE):
        self.count = count
        self._t = 0
        self._pending: list[GpuSignal] = []
        self._broken: dict[int, str] = {}

    def inject(self, s: GpuSignal) -> None:
        """Make GPU ``s.gpu`` go through ``s``: reported by the next :meth:`signals`; a hardware
        fault also leaves the GPU broken until :meth:`clear`."""
        if not 0 <= s.gpu < self.count:
            raise InvalidRequest(f"no GPU {s.gpu} here: this node has GPUs 0-{self.count - 1}")
        self._pending.append(s)
        klass, fault = classify(s)
        if klass is FaultClass.HARDWARE:
            self._broken.setdefault(s.gpu, fault.text())

    def clear(self) -> None:
        """Forget every injected fault: the GPUs are as new (a reset, or a replaced board)."""
        self._pending.clear()
        self._broken.clear()

    def signals(self) -> list[GpuSignal]:
        out, self._pending = self._pending, []
        return out

    def broken(self) -> dict[int, str]:
        return dict(self._broken)

    def sample(self, busy: bool) -> tuple[GpuStat, ...]:
        self._t += 1
        out = []
        for i in range(self.count):
            wobble = math.sin(self._t * 0.7 + i)  # deterministic, so tests can rely on ranges
            util = 92.0 + 6.0 * wobble if busy else 0.0
            if i in self._broken:
                util = 0.0  # a lost GPU does no work
            out.append(GpuStat(
                index=i, name="Simulated GPU", utilization=util,
                memory_used=int(self.MEMORY * (0.6 if busy else 0.0)), memory_total=self.MEMORY,
                temperature=(65.0 if busy else 35.0) + 3.0 * wobble, power_w=(550.0 if busy else 70.0) + 20 * wobble,
            ))
        return tuple(out)

    def close(self) -> None:
        pass


class NvmlGpus:
    """Real GPUs through NVML (the ``pynvml`` module of the nvidia-ml-py package)."""

    name = "nvml"
    injectable = False
    #: Throttle reasons that mean heat, and power (nvmlDeviceGetCurrentClocksThrottleReasons bits).
    THERMAL_BITS = 0x20 | 0x40  # software and hardware thermal slowdown
    POWER_BITS = 0x04 | 0x80  # software power cap, hardware power brake

    def __init__(self):
        import pynvml

        pynvml.nvmlInit()  # raises pynvml.NVMLError without a driver
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        # What the last poll saw per GPU, so that a condition is reported when it begins, not at
        # every poll: the uncorrectable ECC count, pending retirement, lost, throttled for heat or power.
        self._seen: dict[int, dict[Signal, int]] = {i: {} for i in range(len(self._handles))}
        self._events = self._register_xid_events()

    def _register_xid_events(self):
        """An NVML event set with every GPU's Xid critical errors (None where NVML offers none:
        the polled conditions are then all this source reports)."""
        n = self._nvml
        try:
            events = n.nvmlEventSetCreate()
        except n.NVMLError as e:
            log.warning("NVML gives no event set (%s): Xid errors are not watched, only polled conditions", e)
            return None
        for i, h in enumerate(self._handles):
            try:
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, events)
            except n.NVMLError as e:
                log.warning("GPU %d: Xid events not watched (%s)", i, e)
        return events

    def signals(self) -> list[GpuSignal]:
        return [*self._xids(), *(s for i in range(len(self._handles)) for s in self._polled(i))]

    def _xids(self) -> list[GpuSignal]:
        n = self._nvml
        out: list[GpuSignal] = []
        if self._events is None:
            return out
        while True:
            try:
                data = n.nvmlEventSetWait_v2(self._events, 0)
            except n.NVMLError as e:
                if getattr(e, "value", None) != n.NVML_ERROR_TIMEOUT:
                    log.warning("reading NVML's Xid events failed: %s", e)
                return out
            try:
                gpu = int(n.nvmlDeviceGetIndex(data.device))
            except n.NVMLError:
                gpu = -1
            out.append(GpuSignal(Signal.XID, gpu, xid=int(data.eventData)))

    def _polled(self, i: int) -> list[GpuSignal]:
        """The conditions of GPU ``i`` that began since the last poll."""
        n, h, seen = self._nvml, self._handles[i], self._seen[i]
        now: dict[Signal, int] = {}
        try:
            now[Signal.DBE] = int(self._optional(lambda: n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC), 0))
            now[Signal.RETIRED] = int(self._optional(lambda: n.nvmlDeviceGetRetiredPagesPendingStatus(h), 0))
            reasons = int(self._optional(lambda: n.nvmlDeviceGetCurrentClocksThrottleReasons(h), 0))
            now[Signal.THERMAL] = int(bool(reasons & self.THERMAL_BITS))
            now[Signal.POWER] = int(bool(reasons & self.POWER_BITS))
        except n.NVMLError as e:  # _optional passes on only what is not "not supported"
            if getattr(e, "value", None) != n.NVML_ERROR_GPU_IS_LOST:
                raise
            now = {**seen, Signal.LOST: 1}
        out = []
        for signal, value in now.items():
            before = seen.get(signal, 0)
            if value > before:
                detail = f"count {before} -> {value}" if signal is Signal.DBE else ""
                out.append(GpuSignal(signal, i, detail=detail))
        self._seen[i] = now
        return out

    def broken(self) -> dict[int, str]:
        return {i: "GPU is lost" for i, seen in self._seen.items() if seen.get(Signal.LOST)}

    def sample(self, busy: bool) -> tuple[GpuStat, ...]:
        return tuple(self._sample(i, h) for i, h in enumerate(self._handles))

    def _sample(self, i: int, h) -> GpuStat:
        n = self._nvml
        try:
            util = n.nvmlDeviceGetUtilizationRates(h)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            ecc = self._optional(lambda: n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC), 0)
            return GpuStat(
                index=i, name=str(n.nvmlDeviceGetName(h)), utilization=float(util.gpu),
                memory_used=int(mem.used), memory_total=int(mem.total),
                temperature=float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
                power_w=self._optional(lambda: n.nvmlDeviceGetPowerUsage(h) / 1000.0, 0.0),
                ecc_errors=int(ecc),
                # Uncorrected ECC errors make the GPU unusable until reset: drain the node.
                fatal=ecc > 0,
            )
        except n.NVMLError as e:
            # A GPU NVML cannot read (lost) must not stop the heartbeat that carries its fault:
            # the health watch reports it (Signal.LOST) and drains the node.
            return GpuStat(index=i, name=f"unreadable ({e})"[:120], utilization=0.0, memory_used=0, memory_total=0,
                           temperature=0.0, power_w=0.0)

    def _optional(self, read, default):
        """``read()``, or ``default`` where this GPU or driver does not offer it; a lost GPU raises."""
        try:
            return read()
        except self._nvml.NVMLError as e:
            if getattr(e, "value", None) == self._nvml.NVML_ERROR_GPU_IS_LOST:
                raise
            return default

    def close(self) -> None:
        try:
            if self._events is not None:
                self._nvml.nvmlEventSetFree(self._events)
            self._nvml.nvmlShutdown()
        except Exception as e:  # the process is leaving NVML: only its handles are lost
            log.warning("NVML did not shut down cleanly: %s", e)


def open_gpu_source(kind: str = "auto", sim_gpus: int = GPUS_PER_NODE) -> GpuSource:
    if kind == "sim":
        return SimulatedGpus(sim_gpus)
    if kind not in ("auto", "nvml"):
        raise InvalidRequest(f"gpu_source must be auto, nvml or sim, not {kind!r}")
    try:
        import pynvml

        try:
            return NvmlGpus()
        except pynvml.NVMLError as e:
            if kind == "nvml":
                raise InvalidRequest(f"NVML is not usable here: {e}") from e
            log.info("NVML unavailable (%s); using %d simulated GPUs", e, sim_gpus)
    except ImportError as e:
        if kind == "nvml":
            raise InvalidRequest("the pynvml module (package nvidia-ml-py) is not installed") from e
    return SimulatedGpus(sim_gpus)
