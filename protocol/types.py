"""Enums and message types of the hfai wire protocol.

Every message is a frozen dataclass registered with a ``kind`` tag (``KIND`` class attribute);
:mod:`hfai.protocol.codec` turns them into msgpack and back. Field types are restricted to what the
codec understands: ``int``, ``float``, ``str``, ``bool``, ``bytes``, enums, ``X | None``,
``tuple[X, ...]``, ``dict[str, X]`` and nested message dataclasses.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import ClassVar, TypeVar, dataclass_transform

from hfai.protocol._lazy import frozen_dataclass
from hfai.protocol.errors import IllegalTransition, InvalidRequest
from hfai.protocol.reasons import Reason, render

_T = TypeVar("_T")

GPUS_PER_NODE = 8


class Priority(enum.IntEnum):
    """Job priority levels; higher wins. AUTO is resolved at submit time (see ``resolve``)."""

    LOW = 0
    BELOW_NORMAL = 5
    NORMAL = 10
    ABOVE_NORMAL = 20
    HIGH = 30
    VERY_HIGH = 40
    EXTREME_HIGH = 50

    @classmethod
    def parse(cls, text: str | int) -> int:
        """A priority from a level name (any case), a level's number, or AUTO (-> ``AUTO_PRIORITY``,
        resolved by the controller at submit time); raises InvalidRequest otherwise.

        Only the levels exist: the controller refuses any other number, so the parser does too,
        and ``-1`` (which is how AUTO travels) is not a way to spell AUTO."""
        raw = str(text).strip()
        if raw.upper() == "AUTO":
            return AUTO_PRIORITY
        try:
            if raw.lstrip("-").isdigit():
                return cls(int(raw)).value
            return cls[raw.upper().replace("-", "_")].value
        except (KeyError, ValueError):
            raise InvalidRequest(f"unknown priority {str(text)[:40]!r}: use {cls.choices()}") from None

    @classmethod
    def choices(cls) -> str:
        """The accepted spellings, for help texts and errors (one wording everywhere)."""
        return ", ".join(f"{p.name} {p.value}" for p in cls) + " (by name or number), or AUTO"

    @classmethod
    def label(cls, value: int) -> str:
        if value == AUTO_PRIORITY:
            return "AUTO"
        try:
            return cls(value).name
        except ValueError:
            return str(value)


#: Submit-time placeholder: "the highest level I still have quota for" (docs/scheduling.md, "AUTO").
AUTO_PRIORITY = -1


class ChainState(enum.Enum):
    """Lifecycle of a job chain (one job, possibly many runs).

    QUEUED     -> RUNNING, STOPPED, FAILED
    RUNNING    -> SUSPENDING, STOPPING, SUSPENDED (node lost), SUCCEEDED, FAILED,
                  STOPPED (a development session whose one run ended idle or with its node)
    SUSPENDING -> SUSPENDED, STOPPING, SUCCEEDED, FAILED
    SUSPENDED  -> RUNNING, STOPPED, FAILED
    STOPPING   -> STOPPED, SUCCEEDED, FAILED
    SUCCEEDED, FAILED, STOPPED are final.
    """

    QUEUED = "queued"
    RUNNING = "running"
    SUSPENDING = "suspending"
    SUSPENDED = "suspended"
    STOPPING = "stopping"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    # What a state means: plain attributes of each member (set below the class), not properties:
    # the scheduler and the simulator read them millions of times in a replay, and a property
    # call costs several times an attribute read. Annotated without a value, they are no members.
    #: SUCCEEDED, FAILED or STOPPED: the job is over.
    final: bool
    #: Waiting for nodes (QUEUED, SUSPENDED): the scheduler may start it.
    waiting: bool
    #: RUNNING, SUSPENDING or STOPPING: processes may be alive on the job's nodes, so the nodes are not free.
    holds_nodes: bool

    def check(self, new: ChainState) -> ChainState:
        """Return ``new`` if the edge self -> new is legal, else raise IllegalTransition."""
        if new not in _EDGES[self]:
            raise IllegalTransition(f"job cannot go from {self.value} to {new.value}")
        return new


_FINAL = frozenset({ChainState.SUCCEEDED, ChainState.FAILED, ChainState.STOPPED})
_EDGES: dict[ChainState, frozenset[ChainState]] = {
    ChainState.QUEUED: frozenset({ChainState.RUNNING, ChainState.STOPPED, ChainState.FAILED}),
    ChainState.RUNNING: frozenset(
        {ChainState.SUSPENDING, ChainState.STOPPING, ChainState.SUSPENDED, ChainState.SUCCEEDED, ChainState.FAILED,
         ChainState.STOPPED}
    ),
    ChainState.SUSPENDING: frozenset(
        {ChainState.SUSPENDED, ChainState.STOPPING, ChainState.SUCCEEDED, ChainState.FAILED}
    ),
    ChainState.SUSPENDED: frozenset({ChainState.RUNNING, ChainState.STOPPED, ChainState.FAILED}),
    ChainState.STOPPING: frozenset({ChainState.STOPPED, ChainState.SUCCEEDED, ChainState.FAILED}),
    ChainState.SUCCEEDED: frozenset(),
    ChainState.FAILED: frozenset(),
    ChainState.STOPPED: frozenset(),
}
for _state in ChainState:
    _state.final = _state in _FINAL
    _state.waiting = _state in (ChainState.QUEUED, ChainState.SUSPENDED)
    _state.holds_nodes = _state in (ChainState.RUNNING, ChainState.SUSPENDING, ChainState.STOPPING)
del _state


class DesiredRun(enum.Enum):
    """What the leader wants an agent to do with one run: keep it running, suspend it, stop it."""

    RUN = "run"
    SUSPEND = "suspend"
    STOP = "stop"


class RunEventKind(enum.Enum):
    """Events an agent reports about one run on its node.

    STARTED -> SUSPEND_ACKED? -> EXITED; or START_FAILED alone (nothing was started).
    """

    STARTED = "started"
    SUSPEND_ACKED = "suspend_acked"
    EXITED = "exited"
    START_FAILED = "start_failed"


class NodeState(enum.Enum):
    """A node as the controller sees it. UP -> DOWN (no heartbeat) -> UP; UP <-> DRAINED (operator)."""

    UP = "up"
    DOWN = "down"
    DRAINED = "drained"


# --------------------------------------------------------------------------------------- messages

MESSAGE_TYPES: dict[str, type] = {}


def evolve(obj: _T, **changes) -> _T:
    """``dataclasses.replace`` for messages without ``__post_init__``, three times faster: the
    simulator replays hundreds of thousands of record changes. Unknown field names
    raise TypeError, as with ``replace``."""
    names = obj.__dataclass_fields__  # type: ignore[attr-defined]
    for k in changes:
        if k not in names:
            raise TypeError(f"{type(obj).__name__} has no field {k!r}")
    new = object.__new__(type(obj))
    d = new.__dict__
    d.update(obj.__dict__)
    d.update(changes)
    return new


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def message(kind: str) -> Callable[[type[_T]], type[_T]]:
    """Register a frozen dataclass as a wire message with the tag ``kind``."""

    def wrap(cls: type[_T]) -> type[_T]:
        cls = frozen_dataclass(cls)  # its methods made on first use (hfai.protocol._lazy)
        cls.KIND = kind  # type: ignore[attr-defined]  # every message class declares KIND: ClassVar[str]
        if kind in MESSAGE_TYPES:
            raise TypeError(f"duplicate message kind {kind!r}")
        MESSAGE_TYPES[kind] = cls
        return cls

    return wrap


#: JobSpec.kind: a batch job, or a development session.
JOB_BATCH = "batch"
JOB_DEV = "dev"
JOB_KINDS = (JOB_BATCH, JOB_DEV)
#: The exit status of a development session whose JupyterLab stopped itself after ``[dev] idle_s``
#: without activity (hfai.agent.devsession.run_lab): the controller ends it as stopped for
#: idleness. 75 is EX_TEMPFAIL, a status no Python or shell gives on its own.
DEV_IDLE_EXIT = 75


@message("job_spec")
class JobSpec:
    """What a user asks for. ``entrypoint`` is an argv list run in ``workdir`` on every node."""

    KIND: ClassVar[str]
    name: str
    entrypoint: tuple[str, ...]
    workdir: str
    nodes: int = 1
    priority: int = Priority.NORMAL.value
    group: str = "default"
    user: str = ""
    env_name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    # Elastic jobs run on min_nodes..max_nodes (``nodes`` = max_nodes); 0 means a fixed size.
    min_nodes: int = 0
    max_nodes: int = 0
    # Start only after these jobs ended: "ID:ok" (succeeded) or "ID:any".
    after: tuple[str, ...] = ()
    # Stopped by the platform once it has run this long over all its runs (0: no limit).
    time_limit_s: float = 0.0
    # A run that fails (a rank's non-zero exit) is requeued this many times before the job fails.
    retries: int = 0
    # A member of a job array: the array's id, this member's index, and how many members of the
    # array may hold nodes at once (0: no limit).
    array_id: str = ""
    array_index: int = -1
    array_limit: int = 0
    # Submitted by an operator (set by the controller from the caller's credentials, never taken
    # from the client): the priority levels closed by default are open to it.
    by_operator: bool = False
    # What kind of job: JOB_BATCH, or JOB_DEV, a development session (JupyterLab, docs/dev.md),
    # which the scheduler never time-slices and limits per user (docs/scheduling.md).
    kind: str = "batch"
    # A run its node ended as hung (no output for its watchdog time, docs/health.md)
    # is requeued this many times before the job fails (--restart-on-hang).
    restart_on_hang: int = 0

    @property
    def elastic(self) -> bool:
        return self.max_nodes > 0 and self.min_nodes < self.max_nodes


@message("job_event")
class JobEvent:
    """One line of a job's history: a state it entered and why."""

    KIND: ClassVar[str]
    ts: float
    state: ChainState
    reason: str = ""
    # The reason as a typed value (hfai.protocol.reasons); None for a reason given only as words.
    why: Reason | None = None


@message("size_rate")
class SizeRate:
    """A job's throughput measured at one size: its steps (or samples) per second
    on ``nodes`` nodes, averaged over ``seconds`` of its runs at that size. The policy fits its
    speedup curve to these (hfai.controller.policy.speedup)."""

    KIND: ClassVar[str]
    nodes: int
    rate: float
    seconds: float = 0.0


@message("job_record")
class JobRecord:
    """The whole truth about one job chain, stored in KV ``hfai_jobs`` under its id.

    ``run_id`` numbers the runs of the chain (0 = never started). ``nodes`` are the nodes of the
    current run in rank order (``last_nodes``: of the latest run, kept after it ends, for logs).
    ``exits`` maps node -> exit code for the current run. ``slice_turns`` counts how often the job
    gave way to an equal-priority job (round-robin order).
    """

    KIND: ClassVar[str]
    id: str
    spec: JobSpec
    state: ChainState
    submit_ts: float
    run_id: int = 0
    suspend_count: int = 0
    nodes: tuple[str, ...] = ()
    master_addr: str = ""
    master_port: int = 0
    started_ts: float = 0.0
    ended_ts: float = 0.0
    reason: str = ""
    whole_life_state: int = 0
    exits: dict[str, int] = field(default_factory=dict)
    acked: tuple[str, ...] = ()
    slice_turns: int = 0
    # Seconds run in earlier runs of the chain (ABOVE_NORMAL decays after a total), and when the
    # job last entered the queue (submit or requeue).
    run_s: float = 0.0
    queued_ts: float = 0.0
    last_nodes: tuple[str, ...] = ()
    history: tuple[JobEvent, ...] = ()
    # Who put a waiting job on hold ("" = not held); failed runs requeued so far.
    hold: str = ""
    retried: int = 0
    # The fencing token (lease term) of the leader that last decided on this record; a leader
    # takes no decision on a record a later term has written (controller/leader.py).
    term: int = 0
    # When the current run failed and a --retry was granted (0: no retry pending). Set while the
    # other ranks stop, kept while the job waits out its backoff, cleared when it starts again;
    # a retry is its own count (``retried``), never a suspension.
    retry_ts: float = 0.0
    # ``reason`` as a typed value (hfai.protocol.reasons), when the controller gave one; None for
    # a reason given only as words.
    why: Reason | None = None
    # GPU faults seen under the job's runs (a GPU_FAULT reason with the node, at the
    # time the agent saw it; the newest FAULTS_LIMIT), beside its history, which holds only the
    # states it entered: `hfai status` shows them among its history lines.
    faults: tuple[JobEvent, ...] = ()
    # Nodes the job's next start avoids where it can (controller/plan.py): a node
    # whose fault interrupted it (a GPU fault, a lost node). Cleared when it starts again.
    avoid: tuple[str, ...] = ()
    # Compute containers: the most memory one rank's run used at once (its cgroup's
    # peak, bytes) over the job's runs, and the CPU time of all its runs and ranks (seconds).
    peak_bytes: int = 0
    cpu_s: float = 0.0
    # Runs ended as hung that were requeued (``spec.restart_on_hang`` at most).
    hang_restarts: int = 0
    # The job's throughput per size it ran at (one SizeRate per size, by nodes),
    # what the policy sizes an elastic job by (docs/scheduling.md, "Elastic jobs").
    throughput: tuple[SizeRate, ...] = ()
    # The unit of ``throughput``'s rates ("steps", "samples" or "tokens"), and what
    # the job's latest restart cost (seconds from the decision to suspend it to its next run's
    # first step; 0: never measured): what the gain policy weighs a resize against.
    throughput_unit: str = ""
    restart_s: float = 0.0
    # Shown, never stored: the log watchdog of its current run on the node nearest
    # to its watchdog time, as that node's latest heartbeat said, filled in by the controller's
    # status reply (``watch_of``). None while it runs nowhere, or has no watchdog.
    watchdog: RunWatch | None = None

    HISTORY_LIMIT: ClassVar[int] = 50
    FAULTS_LIMIT: ClassVar[int] = 20

    def transition(self, state: ChainState, ts: float, reason: str | Reason = "", **changes) -> JobRecord:
        """A copy in ``state`` (checked against ChainState's edges) with the event appended; a
        typed ``reason`` is kept as ``why`` beside its words."""
        self.state.check(state)
        if isinstance(reason, Reason):
            why: Reason | None = reason
            text = render(reason)
        else:
            why, text = None, reason
        history = (*self.history, JobEvent(ts=ts, state=state, reason=text, why=why))[-self.HISTORY_LIMIT :]
        return evolve(self, state=state, reason=text, why=why, history=history, **changes)


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


def watch_of(job: JobRecord, records: Mapping[str, NodeRecord]) -> RunWatch | None:
    """Pure: the log watchdog to show on ``job``, by its nodes' latest heartbeats (``records``:
    node -> record): its current run's, on the node nearest its watchdog time (the first that
    would end it as hung). None when the job holds no nodes or its run has no watchdog there."""
    if not job.state.holds_nodes:
        return None
    key = run_key(job.id, job.run_id)
    found = [w for n in job.nodes if (r := records.get(n)) is not None and (w := r.watch(key)) is not None]
    return min(found, key=lambda w: (w.watchdog_s - w.silent_s, w.node), default=None)


# Self-fencing (see RunAssignment.fence_s): the launcher SIGTERMs its job once the agent has not
# confirmed liveness for fence_s, and SIGKILLs it once that lasted FENCE_KILL_FACTOR * fence_s.
FENCE_KILL_FACTOR = 4 / 3


@message("run_assignment")
class RunAssignment:
    """One run the leader wants on a node, with everything the agent needs to start it.

    ``fence_s`` (0: off): the run's launcher stops the job when the
    node's agent has not had a heartbeat accepted by NATS for that long (TERM at ``fence_s``, KILL
    at ``FENCE_KILL_FACTOR * fence_s``). The leader sets it well inside its heartbeat timeout, so
    an orphan is dead before the leader can declare the node lost and restart the job elsewhere.
    """

    KIND: ClassVar[str]
    job_id: str
    run_id: int
    name: str
    user: str
    group: str
    priority: int
    rank: int
    world_size: int
    master_addr: str
    master_port: int
    entrypoint: tuple[str, ...]
    workdir: str
    desired: DesiredRun
    env_name: str = ""
    env: dict[str, str] = field(default_factory=dict)
    suspend_count: int = 0
    whole_life_state: int = 0
    ack_window_s: float = 60.0
    kill_window_s: float = 30.0
    fence_s: float = 0.0
    # Failed runs of the chain requeued by --retry so far (HFAI_RETRY_COUNT).
    retry_count: int = 0
    # The job's kind (JobSpec.kind): a development session's run has no watchdog.
    kind: str = "batch"

    @property
    def key(self) -> str:
        return run_key(self.job_id, self.run_id)


def run_key(job_id: str, run_id: int) -> str:
    return f"{job_id}.{run_id}"


@message("node_assignment")
class NodeAssignment:
    """Desired state of one node (KV ``hfai_assign``). ``fence`` is the writer's lease token."""

    KIND: ClassVar[str]
    node: str
    fence: int
    runs: tuple[RunAssignment, ...] = ()


@message("run_event")
class RunEvent:
    """An agent's report about one run, sent on the durable stream ``HFAI_EVENTS``."""

    KIND: ClassVar[str]
    event: RunEventKind
    node: str
    job_id: str
    run_id: int
    ts: float
    exit_code: int | None = None
    acked: bool = False
    platform_stopped: bool = False
    whole_life_state: int | None = None
    message: str = ""
    # What the run used (its cgroup: 0 where it had none), and the memory limit it
    # met when the kernel killed it for memory (0: it was not).
    peak_bytes: int = 0
    cpu_s: float = 0.0
    oom_limit_bytes: int = 0
    # The watchdog time (seconds) the run went past without output, when its
    # launcher ended it as hung (0: it did not).
    hung_s: float = 0.0


@message("gpu_fault_event")
class GpuFaultEvent:
    """An agent's report that a GPU fault happened under a run on its node, sent on the events
    stream beside :class:`RunEvent`; the leader records it in the job's history."""

    KIND: ClassVar[str]
    node: str
    job_id: str
    run_id: int
    fault: GpuFault


@message("run_throughput")
class RunThroughput:
    """An agent's relay of its run's throughput, on the events stream beside
    :class:`RunEvent`: the rate the job measured over its latest window of ``seconds``
    (hfai._throughput), in ``unit`` per second, and ``startup_s``, how long its run took from
    its start to its first step. Only the node of rank 0 relays, at most every ``[agent]
    throughput_relay_s``."""

    KIND: ClassVar[str]
    node: str
    job_id: str
    run_id: int
    ts: float
    rate: float
    seconds: float
    unit: str = "steps"
    startup_s: float = 0.0


@message("leader_lease")
class LeaderLease:
    KIND: ClassVar[str]
    holder: str
    since: float


@message("quota_entry")
class QuotaEntry:
    """At most ``nodes`` nodes for ``user``'s jobs of ``priority`` in ``group`` ("*" = any)."""

    KIND: ClassVar[str]
    user: str
    priority: int
    group: str
    nodes: int


@message("quota_table")
class QuotaTable:
    """All quotas (KV ``hfai_users``, key ``quotas``). No matching entry means no limit."""

    KIND: ClassVar[str]
    entries: tuple[QuotaEntry, ...] = ()


@message("drained_nodes")
class DrainedNodes:
    """Nodes an operator took out of service (KV ``hfai_users``, key ``drained``): node -> why."""

    KIND: ClassVar[str]
    nodes: dict[str, str] = field(default_factory=dict)


@message("restricted_users")
class RestrictedUsers:
    """Users who may not submit and whose jobs may not run (KV ``hfai_users``, key ``restricted``):
    user -> why. The scheduler suspends their running jobs through the normal interrupt protocol
    and keeps the rest waiting; lifting the restriction lets them all resume."""

    KIND: ClassVar[str]
    users: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------------------------- API

@message("submit_request")
class SubmitRequest:
    KIND: ClassVar[str]
    spec: JobSpec
    force: bool = False
    # A job array, one job per index (each sees HFAI_ARRAY_INDEX); at most
    # ``spec.array_limit`` of them hold nodes at once.
    array: tuple[int, ...] = ()
    # The client's name for this submission (random hex, "" for none): the controller derives the
    # job's id from it and the user, so a copy of the request sent again (through another NATS
    # server, after no answer) finds the job the first made instead of making a second.
    request_id: str = ""


@message("list_request")
class ListRequest:
    """One page of jobs ordered by (submit_ts, id): those after ``(after_ts, after_id)``, so that
    paging neither skips nor repeats a job while others arrive or go."""

    KIND: ClassVar[str]
    all_users: bool = True
    include_finished: bool = True
    after_ts: float = 0.0
    after_id: str = ""
    # Only the last N lines of each job's history (-1: all). A list shows the latest
    # state; the whole history (up to 50 lines a job) was most of a page's bytes and decode time.
    history: int = -1


@message("job_request")
class JobRequest:
    """Names one job by id or name (status)."""

    KIND: ClassVar[str]
    job: str


@message("stop_request")
class StopRequest:
    KIND: ClassVar[str]
    job: str


@message("hold_request")
class HoldRequest:
    """Hold a waiting job (it is not started until released) or release it (``hold=False``)."""

    KIND: ClassVar[str]
    job: str
    hold: bool = True


@message("requeue_request")
class RequeueRequest:
    """Interrupt a running job through the normal protocol and put it back in line."""

    KIND: ClassVar[str]
    job: str


@message("update_request")
class UpdateRequest:
    """Change a waiting job: its priority and/or its node count (None: unchanged)."""

    KIND: ClassVar[str]
    job: str
    priority: int | None = None
    nodes: int | None = None


@message("estimate_request")
class EstimateRequest:
    """When would waiting jobs start, if every job ran its time limit (-t) and nothing new came?
    ``default_run_s``: what a job without a limit is assumed to run (0: for ever)."""

    KIND: ClassVar[str]
    default_run_s: float = 0.0
    # With no default_run_s: guess how long a job without a limit runs from the cluster's history
    # (controller/estimate.py, Guess) instead of for ever.
    guess: bool = False


@message("estimate_reply")
class EstimateReply:
    KIND: ClassVar[str]
    starts: dict[str, float] = field(default_factory=dict)  # job id -> estimated start (wall clock)
    now: float = 0.0
    guessed_run_s: float = 0.0  # >0: the guess was used, with this typical running time of a whole job


@message("nodes_request")
class NodesRequest:
    """One page of nodes ordered by name: those after ``after``."""

    KIND: ClassVar[str]
    after: str = ""


@message("quota_set_request")
class QuotaSetRequest:
    """Set (``nodes`` >= 0) or remove (``nodes`` < 0) one quota. Operators only."""

    KIND: ClassVar[str]
    entry: QuotaEntry


@message("quotas_request")
class QuotasRequest:
    KIND: ClassVar[str]


@message("drain_request")
class DrainRequest:
    """Take a node out of service (``drain``) or back in. Operators only."""

    KIND: ClassVar[str]
    node: str
    drain: bool = True
    reason: str = ""


@message("job_reply")
class JobReply:
    KIND: ClassVar[str]
    job: JobRecord
    # The ids of all the members of a submitted job array (``job`` is the first).
    array_ids: tuple[str, ...] = ()


@message("job_list")
class JobList:
    KIND: ClassVar[str]
    jobs: tuple[JobRecord, ...]
    more: bool = False  # a reply holds at most api_reply_bytes: ask again after the last job


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


@message("settings_reply")
class SettingsReply:
    KIND: ClassVar[str]
    quotas: QuotaTable
    drained: DrainedNodes
    # Levels above this need a quota ([controller] quota_needed_above; -1: a controller too old to
    # say, which closed none).
    quota_needed_above: int = -1


@message("error_reply")
class ErrorReply:
    """A refusal. ``message`` is made one non-empty line of at most ``MESSAGE_LIMIT`` characters:
    errors often quote what the caller sent, which may be huge or hold line breaks, and a reply
    must still fit in one NATS message and in one line of the user's terminal."""

    KIND: ClassVar[str]
    code: str
    message: str
    # Which case of ``code`` this is, for a receiver that acts on it (an ``ErrorSub`` value of
    # hfai.protocol.errors; "" for none): ``message`` is for people and may be reworded.
    sub: str = ""

    MESSAGE_LIMIT: ClassVar[int] = 2000

    def __post_init__(self):
        if isinstance(self.message, str):
            text = " ".join(self.message.split()) or f"{self.code} error (no details)"
            if len(text) > self.MESSAGE_LIMIT:
                text = text[: self.MESSAGE_LIMIT - 1] + "…"
            if text != self.message:
                object.__setattr__(self, "message", text)


@message("log_request")
class LogRequest:
    """Asks an agent for a slice of one rank's log file; ``timestamps``: with the
    time each line starting in it was read from the job (``LogChunk.line_ts``)."""

    KIND: ClassVar[str]
    job_id: str
    rank: int
    offset: int = 0
    max_bytes: int = 65536
    timestamps: bool = False


@message("log_chunk")
class LogChunk:
    KIND: ClassVar[str]
    data: bytes
    offset: int
    size: int
    exists: bool = True
    # Asked for (LogRequest.timestamps): when the node read each line that starts in
    # ``data``, in order (Unix time; 0.0: not known, the node kept no time for it). A
    # line starts at data[0] when it is the log's first byte or follows a newline, and after every
    # newline but a last one (hfai.agent.logtimes).
    line_ts: tuple[float, ...] = ()


# --------------------------------------------------------------------------------------- usage

@message("usage_entry")
class UsageEntry:
    """One run of a job and what it held (KV ``hfai_usage``, key ``<job id>.<run id>``): written
    by the controllers when the run has ended, so usage outlives the purged job record."""

    KIND: ClassVar[str]
    job_id: str
    run_id: int
    user: str
    group: str
    priority: int
    nodes: int
    start_ts: float
    end_ts: float
    gpus_per_node: int = GPUS_PER_NODE


@message("usage_request")
class UsageRequest:
    """GPU-hours from ``since_ts`` to ``until_ts`` (0: now), per UTC day, user, group, priority."""

    KIND: ClassVar[str]
    since_ts: float = 0.0
    until_ts: float = 0.0


@message("usage_row")
class UsageRow:
    KIND: ClassVar[str]
    day: str
    user: str
    group: str
    priority: int
    gpu_hours: float
    runs: int


@message("usage_reply")
class UsageReply:
    KIND: ClassVar[str]
    rows: tuple[UsageRow, ...]


# ----------------------------------------------------------------- operator operations on agents

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


# ----------------------------------------------------------------- development sessions

@message("dev_session_request")
class DevSessionRequest:
    """hfai-web asks the agent of a session's node where the session's JupyterLab listens, for
    ``user`` (checked against the run's owner)."""

    KIND: ClassVar[str]
    job_id: str
    user: str


@message("dev_session_reply")
class DevSessionReply:
    """Where the session's JupyterLab listens and the token it was started with (``ready`` False:
    the run is not on the node, or JupyterLab has not written its address yet)."""

    KIND: ClassVar[str]
    ready: bool = False
    address: str = ""
    port: int = 0
    token: str = ""


# ------------------------------------------------------- commands in a job's processes (hfai exec)

@message("exec_request")
class ExecRequest:
    """Run ``argv`` on this node as the job's user, in its workdir and environment, next to rank
    ``rank`` of job ``job_id`` (agent/exec.py). Empty ``argv``: the user's shell. ``tty``: under a
    pseudo-terminal of ``rows`` x ``cols`` with ``TERM=term`` (stdin always forwarded); else with
    pipes, stdin forwarded only if ``stdin``. ``session`` names the session's subjects
    (protocol.names.exec_stream_subject); the caller subscribes to its output before asking."""

    KIND: ClassVar[str]
    job_id: str
    rank: int
    session: str
    argv: tuple[str, ...] = ()
    tty: bool = False
    stdin: bool = False
    rows: int = 24
    cols: int = 80
    term: str = "xterm"


@message("exec_started")
class ExecStarted:
    """The agent's answer: the session runs (``pid`` on ``node``, beside run ``run``). The caller
    keeps it alive with an :class:`ExecInput` at least every ``idle_s`` (it sends one every third
    of it), and acknowledges output so that no more than ``window`` chunks are unacknowledged
    (the agent stops reading the command's output meanwhile)."""

    KIND: ClassVar[str]
    session: str
    node: str
    run: str
    pid: int
    idle_s: float
    window: int


@message("exec_output")
class ExecOutput:
    """Bytes the command wrote (``stream`` 1: stdout or the terminal, 2: stderr), numbered from 0
    in the order sent. Empty ``data``: the agent is alive, the command quiet."""

    KIND: ClassVar[str]
    session: str
    seq: int
    data: bytes = b""
    stream: int = 1


@message("exec_exit")
class ExecExit:
    """The command ended with ``exit_code`` (128+N: killed by signal N) after ``seq`` output chunks
    (0..seq-1); ``reason`` says why the platform ended it, if it did (the job's run ended, the
    caller went silent)."""

    KIND: ClassVar[str]
    session: str
    seq: int
    exit_code: int
    reason: str = ""


@message("exec_input")
class ExecInput:
    """From the caller: ``data`` for the command's stdin (``eof``: no more), a new terminal size
    (``rows``/``cols``, 0: unchanged), a signal for the command's process group (0: none),
    ``acked`` the newest output chunk received (-1: none yet), ``close``: the caller is leaving
    (the command is killed). Empty, it only says the caller is still there."""

    KIND: ClassVar[str]
    session: str
    data: bytes = b""
    eof: bool = False
    rows: int = 0
    cols: int = 0
    signal: int = 0
    acked: int = -1
    close: bool = False
