"""NUMA binding for :func:`hfai.multiprocessing.spawn` (``bind_numa=True``).

On a node with several NUMA nodes, each local rank's CPU affinity is set to the CPUs of the NUMA
node its GPU hangs off, so its data loading and host-side copies stay on local memory. Where the
GPU's node is unknown (no NVML, simulated GPUs, or the driver does not say), ranks are spread over
the host's NUMA nodes in contiguous blocks (ranks 0..k-1 on node 0, ...), the way GPUs are usually
wired. A single-node host (or a CPU set that the job's cgroup confines to one node) is left as
it is. The decision is :func:`plan_affinity`, a pure function; :func:`apply` only acts on it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

SYSFS_NODES = "/sys/devices/system/node"
SYSFS_PCI = "/sys/bus/pci/devices"

CpuSet = frozenset[int]


def parse_cpulist(text: str) -> CpuSet:
    """The kernel's CPU list format (``"0-3,8,10-11"``) as a set of CPU numbers."""
    cpus: set[int] = set()
    for chunk in text.strip().split(","):
        if not chunk:
            continue
        lo, _, hi = chunk.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(cpus)


def host_numa_nodes(root: str | os.PathLike = SYSFS_NODES) -> dict[int, CpuSet]:
    """NUMA node -> its CPUs, from sysfs; nodes without CPUs (memory-only) are left out."""
    nodes: dict[int, CpuSet] = {}
    base = Path(root)
    if not base.is_dir():
        return nodes
    for entry in base.glob("node[0-9]*"):
        try:
            cpus = parse_cpulist((entry / "cpulist").read_text())
        except (OSError, ValueError):
            continue
        if cpus:
            nodes[int(entry.name[4:])] = cpus
    return nodes


def plan_affinity(nprocs: int, host_nodes: Mapping[int, CpuSet], gpu_nodes: Sequence[int | None] | None,
                  allowed: CpuSet) -> list[CpuSet | None]:
    """The CPU set for each local rank, or None where it is to be left alone.

    ``host_nodes``: NUMA node -> CPUs; ``gpu_nodes``: the NUMA node of each local rank's GPU
    (None for unknown), or None when there is no GPU information at all; ``allowed``: the CPUs
    this process may use (its affinity, as the job's cgroup set it). Only allowed CPUs are
    handed out, and a rank whose share would be empty is left alone."""
    usable = {n: cpus & allowed for n, cpus in host_nodes.items() if cpus & allowed}
    if nprocs <= 0 or len(usable) <= 1:
        return [None] * max(nprocs, 0)
    order = sorted(usable)
    plan: list[CpuSet | None] = []
    for rank in range(nprocs):
        node = gpu_nodes[rank] if gpu_nodes is not None and rank < len(gpu_nodes) else None
        if gpu_nodes is None:
            node = order[rank * len(order) // nprocs]
        plan.append(usable.get(node) if node is not None else None)
    return plan


def visible_gpus(env: Mapping[str, str] | None = None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as a list of indices or UUIDs, or None when it is not set."""
    raw = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    return [d.strip() for d in raw.split(",") if d.strip()]


def gpu_numa_nodes(nprocs: int, pci_root: str | os.PathLike = SYSFS_PCI) -> list[int | None] | None:
    """The NUMA node of each local rank's GPU (rank i uses the i-th visible GPU), through NVML and
    the GPU's PCI device in sysfs; None when NVML is not there (no driver, no GPU)."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as e:
        log.debug("NVML unavailable (%s): NUMA binding spreads ranks over the host's nodes", e)
        return None
    try:
        devices = visible_gpus()
        handles = []
        for rank in range(nprocs):
            if devices is None:
                handles.append(pynvml.nvmlDeviceGetHandleByIndex(rank) if rank < pynvml.nvmlDeviceGetCount() else None)
            elif rank >= len(devices):
                handles.append(None)
            elif devices[rank].isdigit():
                handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(devices[rank])))
            else:
                handles.append(pynvml.nvmlDeviceGetHandleByUUID(devices[rank]))
        return [_pci_numa_node(h, pci_root) if h is not None else None for h in handles]
    except pynvml.NVMLError as e:
        log.warning("NVML could not map GPUs to NUMA nodes (%s): ranks spread over the host's nodes", e)
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass  # NVML never came up: nothing to shut down


def _pci_numa_node(handle, pci_root: str | os.PathLike) -> int | None:
    import pynvml

    bus_id = pynvml.nvmlDeviceGetPciInfo(handle).busId
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode()
    # NVML spells the domain with 8 hex digits, sysfs with 4: "00000000:17:00.0" -> "0000:17:00.0".
    domain, _, rest = bus_id.lower().partition(":")
    try:
        node = int((Path(pci_root) / f"{domain[-4:]}:{rest}" / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def plan_for_this_host(nprocs: int) -> list[CpuSet | None]:
    """:func:`plan_affinity` with this host's topology, GPUs and the calling process's CPU set."""
    nodes = host_numa_nodes()
    if len(nodes) <= 1:
        return [None] * nprocs  # the common case: no NVML call at all
    return plan_affinity(nprocs, nodes, gpu_numa_nodes(nprocs), frozenset(os.sched_getaffinity(0)))


def apply(cpus: CpuSet | None) -> None:
    """Bind the calling process (and the threads it starts afterwards) to ``cpus``; None: leave it."""
    if cpus:
        os.sched_setaffinity(0, cpus)
