"""Jobs on the wire: what a user asks for (:class:`JobSpec`, its :class:`Priority`), the record
of a job chain and its states (:class:`JobRecord`, :class:`ChainState`), and the controller API's
requests and replies about jobs (submit, list, status, stop, hold, requeue, update, estimate).
"""

from __future__ import annotations

import enum
from dataclasses import field
from typing import ClassVar

from hfai.protocol.errors import IllegalTransition, InvalidRequest
from hfai.protocol.messages import evolve, message
from hfai.protocol.nodes import RunWatch
from hfai.protocol.reasons import Reason, render


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
    speedup curve to these (hfai.controller.policy.speedup). ``gpu_util``: the mean GPU
    utilisation (%) of its nodes meanwhile, as their heartbeats said, over ``util_s`` of those
    seconds (None: no heartbeat said)."""

    KIND: ClassVar[str]
    nodes: int
    rate: float
    seconds: float = 0.0
    gpu_util: float | None = None
    util_s: float = 0.0


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


# ---------------------------------------------------------------------- the API's verbs on jobs

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

