"""Nodes on the wire: an agent's heartbeat (:class:`NodeRecord`: GPUs, host, health, the
watchdogs of its runs), a node as the API shows it (:class:`NodeInfo`, :class:`NodeState`), and
the operator operations on one node's agent (suspend it, its health watch).
"""

from __future__ import annotations

import enum
from typing import ClassVar

from hfai.protocol.messages import evolve, message
from hfai.protocol.reasons import Reason, render

GPUS_PER_NODE = 8


class NodeState(enum.Enum):
    """A node as the controller sees it. UP -> DOWN (no heartbeat) -> UP; UP <-> DRAINED (operator)."""

    UP = "up"
    DOWN = "down"
    DRAINED = "drained"


@message("gpu_stat")
class GpuStat:
    KIND: ClassVar[str]
    index: int
    name: str
    utilization: float
    memory_used: int
    memory_total: int
    temperature: float
    power_w: float
    ecc_errors: int = 0
    xid: int = 0
    fatal: bool = False


@message("gpu_fault")
class GpuFault:
    """One GPU fault a node's health watch classified (hfai.agent.health): when it saw it, what it
    is (a GPU_FAULT :class:`Reason`: GPU, Xid, meaning, kind), and whether it is the hardware's
    (the node drains itself) rather than the job's or a warning."""

    KIND: ClassVar[str]
    ts: float
    why: Reason
    hardware: bool = False

    def text(self) -> str:
        return render(self.why)


@message("health_check")
class HealthCheck:
    """The node validator's last run (hfai.agent.health_check): when it ran, whether every step
    passed, how long it took, and what failed (one line per failed step)."""

    KIND: ClassVar[str]
    ts: float
    ok: bool
    duration_s: float = 0.0
    detail: str = ""
    # The bus bandwidth (GB/s) the in-node all-reduce step measured through
    # hfreduce (0: the step did not run or did not get that far).
    bus_gbps: float = 0.0


@message("run_watch")
class RunWatch:
    """A running job's log watchdog on one node (agent/watchdog.py): the watchdog
    time the run's launcher holds now, and how long the run had been silent (no output on any of
    its processes there) at ``ts``, the node's time when it looked. ``run`` is the run's key
    (``job.run``); ``node`` names the node once the controller shows it on the job."""

    KIND: ClassVar[str]
    run: str
    watchdog_s: float
    silent_s: float
    ts: float = 0.0
    node: str = ""


@message("host_stat")
class HostStat:
    KIND: ClassVar[str]
    cpu_percent: float
    memory_used: int
    memory_total: int
    load1: float


@message("node_record")
class NodeRecord:
    """An agent's heartbeat: who it is, what it has, how it is doing. KV ``hfai_nodes``."""

    KIND: ClassVar[str]
    name: str
    group: str
    address: str
    ts: float
    seq: int
    gpus: tuple[GpuStat, ...] = ()
    host: HostStat | None = None
    envs: tuple[str, ...] = ()
    gpu_source: str = ""
    runs: tuple[str, ...] = ()
    agent_version: str = ""
    # Why the agent takes no new work ("" = it does): its node drained by itself, e.g. its state
    # directory is full (agent/diskwatch.py); it undrains itself when that is over.
    drain_reason: str = ""
    # Node health (agent/health.py): the hardware fault that drains the node until
    # a health check passes or an operator forces it back (None: none), the node's latest faults
    # (newest last, a few), and the validator's last result (None: it has not run).
    fault: GpuFault | None = None
    faults: tuple[GpuFault, ...] = ()
    check: HealthCheck | None = None
    # How the node contains its runs, in one line ("bwrap, cgroup v1", or what is
    # missing and why: agent/contain.py).
    containment: str = ""
    # The log watchdog of each of its running runs that has one (a development
    # session has none): what `hfai status` and the job page show (RunWatch).
    watchdogs: tuple[RunWatch, ...] = ()

    def watch(self, run: str) -> RunWatch | None:
        """The watchdog of run ``run`` (its key) on this node, named after it; None without one."""
        for w in self.watchdogs:
            if w.run == run:
                return evolve(w, node=self.name)
        return None


# ------------------------------------------------------------------------- the API's nodes verb

@message("nodes_request")
class NodesRequest:
    """One page of nodes ordered by name: those after ``after``."""

    KIND: ClassVar[str]
    after: str = ""


@message("node_info")
class NodeInfo:
    """A node as ``hfai nodes`` shows it. ``age_s``: since this controller last saw a heartbeat;
    ``reason``: why an operator drained it (kept while it is also down)."""

    KIND: ClassVar[str]
    record: NodeRecord
    state: NodeState
    age_s: float
    jobs: tuple[str, ...] = ()
    reason: str = ""


@message("store_health")
class StoreHealth:
    """Whether the NATS store takes writes, as the answering controller's probe saw it
    (controller/store_health.py). ``writable`` turns False after a run of failed probe writes;
    ``since``: wall time the current run of failures (or successes) began; ``failures``: probes
    failed in a row; ``detail``: the last failure; ``checked``: wall time of the last probe (0:
    none yet)."""

    KIND: ClassVar[str]
    writable: bool = True
    since: float = 0.0
    failures: int = 0
    detail: str = ""
    checked: float = 0.0


@message("nodes_reply")
class NodesReply:
    KIND: ClassVar[str]
    nodes: tuple[NodeInfo, ...]
    more: bool = False  # a reply holds at most api_reply_bytes: ask again after the last node
    # Added with a default (decoders of any 1.x ignore it or fill it in): the NATS store's health
    # as the answering replica sees it; None from a controller that does not probe.
    store: StoreHealth | None = None


# -------------------------------------------------------- operator operations on a node's agent

@message("node_suspend_request")
class NodeSuspendRequest:
    """Asks one node's agent to interrupt every run on it as the platform does (suspend flag,
    checkpoint, acknowledgement; SIGTERM and SIGKILL after the windows) and to start nothing
    more until the agent restarts: the node is going down (``hfai local down``). Windows of None
    are each run's own (the leader's, from ``[controller]``). The agent answers once every run
    has ended and its end is reported, or after ``wait_s`` (0: at once, with what it interrupts).
    Asking again changes nothing but the windows."""

    KIND: ClassVar[str]
    ack_window_s: float | None = None
    kill_window_s: float | None = None
    wait_s: float = 0.0


@message("node_suspend_reply")
class NodeSuspendReply:
    """The runs the suspend interrupts (those alive on the node since it began) and those of them
    not yet ended and reported (none: the node is settled)."""

    KIND: ClassVar[str]
    node: str
    interrupted: tuple[str, ...] = ()
    unsettled: tuple[str, ...] = ()


#: NodeHealthRequest.action.
HEALTH_FAULT = "fault"  # inject a fault into simulated GPUs (refused on real NVML)
HEALTH_CLEAR = "clear"  # simulated GPUs: forget the injected faults (the GPU "replaced")
HEALTH_VALIDATE = "validate"  # run the node validator now
HEALTH_UNDRAIN = "undrain"  # put a node drained by a fault back: only after a passing check, or forced
HEALTH_ACTIONS = (HEALTH_FAULT, HEALTH_CLEAR, HEALTH_VALIDATE, HEALTH_UNDRAIN)


@message("node_health_request")
class NodeHealthRequest:
    """An operator's request to one node's health watch (agent operation ``health``). For
    ``fault``: ``signal`` is "xid" (with ``xid``), "dbe", "retired", "lost", "thermal" or "power",
    on GPU ``gpu``. ``force``: undrain without a passing check."""

    KIND: ClassVar[str]
    action: str
    xid: int = 0
    gpu: int = 0
    signal: str = "xid"
    force: bool = False


@message("node_health_reply")
class NodeHealthReply:
    """What the node's health watch says after the request: its fault (None: in service as far
    as health goes), its last check, and one line for the operator."""

    KIND: ClassVar[str]
    node: str
    message: str = ""
    fault: GpuFault | None = None
    check: HealthCheck | None = None

