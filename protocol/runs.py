"""Runs on the wire: what the leader wants each node to run (:class:`RunAssignment`,
:class:`NodeAssignment`), what agents report about them (:class:`RunEvent`, GPU faults,
throughput), and what is asked of a run on its node: a slice of its log, a development session's
address, and commands in its processes (``hfai exec``, ``hfai shell``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import field
from typing import ClassVar

from hfai.protocol.jobs import JobRecord
from hfai.protocol.messages import message
from hfai.protocol.nodes import GpuFault, NodeRecord, RunWatch


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


# ---------------------------------------------------------------------------------- a run's log

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


# ------------------------------------------------------------------------- development sessions

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


# ---------------------------------------------------- commands in a job's processes (hfai exec)

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

