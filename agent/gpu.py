"""GPU telemetry sources behind one small interface: NVML (real) and simulated (no GPU here).

``open_gpu_source("auto")`` tries NVML and falls back to the simulated source when the NVML
library is absent, as on a laptop or CI machine; "nvml" insists, "sim" forces the simulation.
"""

from __future__ import annotations

import logging
import math
from typing import Protocol

from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import GPUS_PER_NODE, GpuStat

log = logging.getLogger(__name__)


class GpuSource(Protocol):
    name: str

    def sample(self, busy: bool) -> tuple[GpuStat, ...]:
        """One reading per GPU. ``busy`` says whether a job runs here (used by the simulation only)."""

    def close(self) -> None: ...


class SimulatedGpus:
    """Eight H100-like GPUs whose load follows whether a job is running on the node."""

    name = "sim"
    MEMORY = 80 * 1024**3

    def __init__(self, count: int = GPUS_PER_NODE):
        self.count = count
        self._t = 0

    def sample(self, busy: bool) -> tuple[GpuStat, ...]:
        self._t += 1
        out = []
        for i in range(self.count):
            wobble = math.sin(self._t * 0.7 + i)  # deterministic, so tests can rely on ranges
            util = 92.0 + 6.0 * wobble if busy else 0.0
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

    def __init__(self):
        import pynvml

        pynvml.nvmlInit()  # raises pynvml.NVMLError without a driver
        self._nvml = pynvml
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]

    def sample(self, busy: bool) -> tuple[GpuStat, ...]:
        n = self._nvml
        out = []
        for i, h in enumerate(self._handles):
            util = n.nvmlDeviceGetUtilizationRates(h)
            mem = n.nvmlDeviceGetMemoryInfo(h)
            ecc = self._optional(lambda h=h: n.nvmlDeviceGetTotalEccErrors(
                h, n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC), 0)
            out.append(GpuStat(
                index=i, name=str(n.nvmlDeviceGetName(h)), utilization=float(util.gpu),
                memory_used=int(mem.used), memory_total=int(mem.total),
                temperature=float(n.nvmlDeviceGetTemperature(h, n.NVML_TEMPERATURE_GPU)),
                power_w=self._optional(lambda h=h: n.nvmlDeviceGetPowerUsage(h) / 1000.0, 0.0),
                ecc_errors=int(ecc),
                # Uncorrected ECC errors make the GPU unusable until reset: drain the node.
                fatal=ecc > 0,
            ))
        return tuple(out)

    def _optional(self, read, default):
        try:
            return read()
        except self._nvml.NVMLError:
            return default

    def close(self) -> None:
        try:
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
