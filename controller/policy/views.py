"""The policy's inputs and outputs: job and node views, quotas and settings, and decisions.

Frozen dataclasses, no behaviour beyond what a view works out once about itself: the leader
builds them from records (controller/views.py), the simulator from its trace, and every policy
(hfai's, and the simulator's baselines) reads and returns these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hfai.protocol.quotas import Quotas
from hfai.protocol.reasons import Reason, render
from hfai.protocol.speedup import LOW_GPU_UTIL
from hfai.protocol.types import ChainState


@dataclass(frozen=True)
class PolicyConfig:
    #: A running job holds its nodes at least this long before an equal-priority job may take
    #: them (time slice), and an elastic job runs this long before it is grown.
    slice_s: float = 1800.0
    #: ABOVE_NORMAL counts as NORMAL once the job has run this long in total (anti-hogging).
    above_normal_s: float = math.inf
    quotas: Quotas = field(default_factory=Quotas)
    #: Grow an elastic job only if it gains at least this fraction of its size (and one node):
    #: growing costs a restart, so a tiny gain is not worth it.
    grow_min_gain: float = 0.25
    #: What one resize costs an elastic job: checkpoint and restart, seconds without progress.
    #: The gain policy resizes only when the throughput gained over the coming slice pays for it.
    resize_cost_s: float = 120.0
    #: The gain policy gives an elastic job an idle node only if that node adds at least this
    #: share of one node's throughput (a node that adds less stays free for the next arrival,
    #: which then starts at once instead of waiting a slice for it), and takes surplus nodes that
    #: add less than this first from its victims. 0.8 did best on the Pollux-derived traces
    #: (bench/bench_elastic.py; 0.2 and 0.5 gave up to 9% longer average JCT, twice the p99 wait).
    node_gain_min: float = 0.8
    #: The gain policy's prior for sizes a job was not measured at: Amdahl's serial fraction (0:
    #: linear, what hfai assumes of every job; controller/policy/speedup.py says why).
    prior_serial: float = 0.0
    #: The gain policy takes a job whose GPUs were used less than this (%, mean over its nodes,
    #: persistently: JobView.gpu_util) at some size to gain nothing from more nodes than that:
    #: its bottleneck is elsewhere (input, storage, communication).
    low_gpu_util: float = LOW_GPU_UTIL
    #: Attained-service bands, in slices of node-time (``slice_s`` node-seconds; with the default
    #: slice: 1, 8 and 64 node-hours). Within a priority, jobs in a lower band (less service so far)
    #: go first and may take a time slice from jobs in a higher one; FIFO within a band.
    service_bands: tuple[float, ...] = (2.0, 16.0, 128.0)
    #: A blocked job lets later jobs of its own user and priority run on the free nodes (it could
    #: not take them back) until it has waited this long; then it keeps them free for itself.
    own_backfill_s: float = 4 * 3600.0
    #: False: leave out Wait decisions of jobs that stay where they are (the simulator does not
    #: need them; the live leader wants every reason).
    explain_waits: bool = True


@dataclass(frozen=True)
class JobView:
    """What the policy needs to know about a job.

    ``priority`` is the declared level (never AUTO: resolve that at submit, :func:`resolve_auto`).
    ``nodes`` is the size asked for; an elastic job also sets ``min_nodes``/``max_nodes`` (0: same
    as ``nodes``). ``held`` are the nodes of the current run (its length is the running size).
    ``run_s`` is the time the job ran in earlier runs of its chain, not counting the current one.
    ``queued_ts`` is when a waiting job last entered the queue (0: at ``submit_ts``).
    """

    id: str
    user: str
    priority: int
    nodes: int
    submit_ts: float
    state: ChainState
    group: str = "default"
    held: tuple[str, ...] = ()
    started_ts: float = 0.0
    slice_turns: int = 0
    min_nodes: int = 0
    max_nodes: int = 0
    run_s: float = 0.0
    queued_ts: float = 0.0
    #: Submitted by an operator: the levels closed by default (Quotas.closed_above) are open to it.
    exempt: bool = False
    #: A development session (JobSpec.kind "dev"): never time-sliced (docs/scheduling.md).
    dev: bool = False
    #: Its name: a job waiting for its user's development session names it (``hfai dev stop NAME``).
    name: str = ""
    #: Measured throughput per size, ``(nodes, rate)`` in any unit (JobRecord.throughput): what
    #: the gain policy fits the job's speedup curve to (hfai.controller.policy.speedup).
    throughput: tuple[tuple[int, float], ...] = ()
    #: The unit of those rates ("steps", "samples", "tokens"; "": none measured), and what its
    #: latest restart cost, seconds (0: never measured; the policy's ``resize_cost_s`` then).
    throughput_unit: str = ""
    restart_s: float = 0.0
    #: ``(nodes, GPU utilisation %)`` of the sizes its nodes' utilisation was measured at long
    #: enough (controller/throughput.py): a size it kept its GPUs mostly idle at is one past which
    #: more nodes will not help it (``PolicyConfig.low_gpu_util``).
    gpu_util: tuple[tuple[int, float], ...] = ()
    # Worked out once per view (a round reads them millions of times in a replay):
    lo: int = field(init=False, repr=False, compare=False)  # fewest nodes the job can run on
    hi: int = field(init=False, repr=False, compare=False)  # most nodes the job can use
    size: int = field(init=False, repr=False, compare=False)  # nodes it holds now, else asks for

    def __post_init__(self) -> None:
        lo = self.min_nodes or self.nodes
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", max(self.max_nodes or self.nodes, lo))
        object.__setattr__(self, "size", len(self.held) or self.nodes)

    @property
    def waited_since(self) -> float:
        """When it last entered the queue (submit or requeue)."""
        return self.queued_ts or self.submit_ts


@dataclass(frozen=True)
class NodeView:
    name: str
    group: str = "default"
    schedulable: bool = True


@dataclass(frozen=True)
class Start:
    """Run the job on ``nodes`` (rank order); ``len(nodes)`` is its world size this run."""

    job_id: str
    nodes: tuple[str, ...]
    reason: str = ""


@dataclass(frozen=True)
class Suspend:
    """Interrupt the job (checkpoint, release the nodes) and requeue it keeping its place."""

    job_id: str
    why: Reason
    for_job: str
    # True when the job yields to an equal-priority job (it then moves back in the round-robin).
    sliced: bool = False

    @property
    def reason(self) -> str:
        return render(self.why)


@dataclass(frozen=True)
class Resize(Suspend):
    """An elastic job changes size: interrupt it exactly like :class:`Suspend`; the policy then
    restarts it (a :class:`Start`) with about ``size`` nodes and a new world size. ``for_job`` is
    empty when it grows into idle nodes."""

    size: int = 0


@dataclass(frozen=True)
class Wait:
    job_id: str
    why: Reason

    @property
    def reason(self) -> str:
        return render(self.why)


Decision = Start | Suspend | Wait
