"""The agent's reconciliation plan (pure): desired runs + what is on the node -> actions.

Level-triggered: the same inputs always give the same plan, so the agent can re-plan every tick
and after a restart. A run is started only if this node has never had it (its run directory is
the record), so no run is ever started twice on a node.

Interrupt windows, per run, measured from when the agent raised the suspend flag, on the boot
clock (``Clock.boottime``: never stepped, the same for an agent restarted mid-window; the stamps
are the agent's own, agent/stamps.py), never on the wall clock or a time a job can set:
  no ack within ``ack_window_s`` -> SIGTERM;
  ack -> the job normally exits by itself (``go_suspend`` exits); still alive ``ack_exit_grace_s``
  after its ack -> SIGTERM (at once if the ack asked to be stopped: ``go_suspend(exit=False)``);
  still alive ``kill_window_s`` after a SIGTERM -> SIGKILL.

The plan decides on each run's lifecycle state (agent/lifecycle.py: RunState), read from its run
directory; :func:`next_state` says what each act does to it, and refuses an act its state does not
allow (the agent checks every act before it carries it out).

The grace after an ack is seconds, not a blink: a job's ack often precedes its exit by a while
(spawned workers: one rank acks, the others finish their share, then the parent joins them and its
interpreter winds down), and a SIGTERM then would turn a clean exit into "exited with code -15".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hfai.agent.lifecycle import RunState, run_state
from hfai.protocol.errors import IllegalTransition
from hfai.protocol.types import DesiredRun, RunAssignment, RunEventKind


class RunPhase(enum.Enum):
    """A run's process on this node: ALIVE -> EXITED (exit status known or launcher gone). One
    of the facts its lifecycle state (RunState) is read from."""

    ALIVE = "alive"
    EXITED = "exited"


@dataclass(frozen=True)
class LocalRun:
    """A snapshot of one run directory on this node."""

    key: str
    assignment: RunAssignment
    phase: RunPhase
    exit_code: int | None = None
    # On the agent's boot clock (Clock.boottime): when it raised the suspend flag, first saw the
    # job's acknowledgement, sent the SIGTERM (None: not yet).
    suspend_ts: float | None = None
    acked: bool = False
    ack_ts: float | None = None
    term_ts: float | None = None
    sent: frozenset[RunEventKind] = frozenset()
    # The agent sent it SIGKILL.
    killed: bool = False
    # Its launcher stopped it because this agent was silent too long (self-fencing).
    fenced: bool = False
    # Its launcher ended it as hung: the watchdog time (seconds) it went past without output (0: not).
    hung_s: float = 0.0
    # The ack asks the platform to stop the job now (``go_suspend(exit=False)``): no exit grace.
    ack_stop: bool = False
    # Its launcher is gone and recorded no exit status (so it reads as killed, -9).
    lost: bool = False
    # What it used, from its cgroup once it ended (None: no cgroup, or not ended yet).
    usage: RunUsage | None = None

    @property
    def state(self) -> RunState:
        """Where the run is in its lifecycle, as these facts of its run directory say."""
        return run_state(exited=self.phase is RunPhase.EXITED, exit_reported=RunEventKind.EXITED in self.sent,
                         killed=self.killed, terminated=self.term_ts is not None,
                         suspend_raised=self.suspend_ts is not None, acked=self.acked,
                         start_reported=RunEventKind.STARTED in self.sent)


@dataclass(frozen=True)
class RunUsage:
    """A run's cgroup figures as its launcher recorded them (launcher.USAGE_FILE)."""

    peak_bytes: int = 0
    cpu_s: float = 0.0
    oom_kills: int = 0
    limit_bytes: int = 0


def platform_stopped(run: LocalRun | None) -> bool:
    """Did the platform end this run (suspend flag, SIGTERM, or self-fencing)? Its exit is then an
    interruption the leader requeues, never the user's failure."""
    return run is not None and (run.suspend_ts is not None or run.term_ts is not None or run.fenced)


def fence_problem(fence_s: float, heartbeat_interval_s: float) -> str | None:
    """Why this node's launchers would fence healthy jobs with this bound, or None. A heartbeat
    late by a little (a slow KV put, a busy host) must not stop jobs: ask for three heartbeats per
    bound."""
    if fence_s > 0 and fence_s < 3 * heartbeat_interval_s:
        return (f"runs fence themselves after {fence_s:g}s without an accepted heartbeat, but heartbeats "
                f"are {heartbeat_interval_s:g}s apart: raise [controller] heartbeat_timeout_s or lower "
                f"[agent] heartbeat_interval_s (fence bound = 0.6 * heartbeat_timeout_s)")
    return None


# How long a job that acknowledged a suspend may take to exit by itself ([agent] ack_exit_grace_s).
ACK_EXIT_GRACE_S = 15.0


class Act(enum.Enum):
    START = "start"
    RAISE_SUSPEND = "raise_suspend"
    TERMINATE = "terminate"
    KILL = "kill"
    REPORT_STARTED = "report_started"
    REPORT_ACK = "report_ack"
    REPORT_EXIT = "report_exit"
    REPORT_NEVER_RAN = "report_never_ran"
    CLEANUP = "cleanup"


@dataclass(frozen=True)
class Action:
    act: Act
    key: str
    run: RunAssignment


_S = RunState
_KNOWN = tuple(s for s in RunState if s is not _S.ABSENT)
# What each act does to a run: from each state it may be taken in, the steps its writes make (each
# one RunState.check allows; none: the act changes no state, a report owed whatever the state).
STEPS: dict[Act, dict[RunState, tuple[RunState, ...]]] = {
    Act.START: {_S.ABSENT: (_S.STARTING,)},
    Act.REPORT_NEVER_RAN: {_S.ABSENT: (_S.EXITED, _S.REPORTED)},  # recorded as over, then reported
    Act.RAISE_SUSPEND: {_S.STARTING: (_S.SUSPEND_RAISED,), _S.RUNNING: (_S.SUSPEND_RAISED,),
                        # Raised late, on a run already signalled: see _suspend.
                        _S.TERMINATED: (_S.TERMINATED,), _S.KILLED: (_S.KILLED,)},
    Act.TERMINATE: {s: (_S.TERMINATED,) for s in (_S.STARTING, _S.RUNNING, _S.SUSPEND_RAISED, _S.ACKNOWLEDGED)},
    Act.KILL: {s: (_S.KILLED,) for s in (_S.TERMINATED, _S.KILLED)},
    Act.REPORT_STARTED: {s: (_S.RUNNING,) if s is _S.STARTING else () for s in _KNOWN},
    Act.REPORT_ACK: {s: () for s in _KNOWN},
    Act.REPORT_EXIT: {_S.EXITED: (_S.REPORTED,)},
    Act.CLEANUP: {_S.REPORTED: (_S.ABSENT,)},
}


def next_state(run: LocalRun | None, act: Act) -> RunState:
    """The state ``act`` takes ``run`` to (None: the node has no such run), each step checked by
    RunState.check. Raises IllegalTransition if the run's state does not allow the act."""
    state = _S.ABSENT if run is None else run.state
    steps = STEPS[act].get(state)
    if steps is None:
        raise IllegalTransition(f"cannot {act.value} a run that is {state.value}")
    for new in steps:
        state = state.check(new)
    return state


def plan(desired: dict[str, RunAssignment], local: dict[str, LocalRun], now: float,
         ack_exit_grace_s: float = ACK_EXIT_GRACE_S) -> list[Action]:
    """``now``: the agent's boot clock (Clock.boottime), which the runs' stamps are on."""
    actions: list[Action] = []
    for key, ra in desired.items():
        lr = local.get(key)
        if lr is None:
            if ra.desired is DesiredRun.RUN:
                actions.append(Action(Act.START, key, ra))
            else:
                # Suspended or stopped before it ever started here: say so, or the leader waits.
                actions.append(Action(Act.REPORT_NEVER_RAN, key, ra))
            continue
        actions.extend(_plan_known(ra, lr, now, ack_exit_grace_s))
    for key, lr in local.items():
        if key in desired:
            continue
        state = lr.state
        if state.alive:
            # No longer wanted here (job failed elsewhere, requeued after a failover, ...).
            actions.extend(_stop(lr, state, now, lr.assignment))
        elif state is _S.EXITED:
            actions.append(Action(Act.REPORT_EXIT, key, lr.assignment))
        else:
            actions.append(Action(Act.CLEANUP, key, lr.assignment))
    return actions


def _plan_known(ra: RunAssignment, lr: LocalRun, now: float, ack_exit_grace_s: float) -> list[Action]:
    key = lr.key
    out: list[Action] = []
    # Owed whatever the state: a run may be interrupted, or exit, before its start reached the leader.
    if RunEventKind.STARTED not in lr.sent:
        out.append(Action(Act.REPORT_STARTED, key, ra))
    if lr.acked and RunEventKind.SUSPEND_ACKED not in lr.sent:
        out.append(Action(Act.REPORT_ACK, key, ra))
    state = lr.state
    if state is _S.EXITED:
        out.append(Action(Act.REPORT_EXIT, key, ra))
    if not state.alive:
        return out
    if ra.desired is DesiredRun.SUSPEND:
        out.extend(_suspend(ra, lr, state, now, ack_exit_grace_s))
    elif ra.desired is DesiredRun.STOP:
        out.extend(_stop(lr, state, now, ra))
    return out


def _suspend(ra: RunAssignment, lr: LocalRun, state: RunState, now: float, ack_exit_grace_s: float) -> list[Action]:
    """The interrupt windows of a live run the leader wants suspended (see the module's docstring)."""
    if lr.suspend_ts is None:
        # Not raised yet; or a run already signalled without it (stopped as no longer wanted, then
        # held suspended by an operator): the flag still lets it checkpoint before its SIGKILL.
        return [Action(Act.RAISE_SUSPEND, lr.key, ra)]
    if ((state is _S.SUSPEND_RAISED and now - lr.suspend_ts >= ra.ack_window_s)
            or (state is _S.ACKNOWLEDGED and _ack_grace_over(lr, now, ack_exit_grace_s))):
        return [Action(Act.TERMINATE, lr.key, ra)]
    if state in (_S.TERMINATED, _S.KILLED) and _kill_due(lr, ra, now):
        return [Action(Act.KILL, lr.key, ra)]
    return []


def _ack_grace_over(lr: LocalRun, now: float, grace_s: float) -> bool:
    if lr.ack_stop:
        return True
    return now - (lr.ack_ts if lr.ack_ts is not None else now) >= grace_s


def _stop(lr: LocalRun, state: RunState, now: float, ra: RunAssignment) -> list[Action]:
    """A live run to end: SIGTERM, then SIGKILL once its kill window is over (again every plan
    until its launcher is gone)."""
    if state not in (_S.TERMINATED, _S.KILLED):
        return [Action(Act.TERMINATE, lr.key, ra)]
    if _kill_due(lr, ra, now):
        return [Action(Act.KILL, lr.key, ra)]
    return []


def _kill_due(lr: LocalRun, ra: RunAssignment, now: float) -> bool:
    """Is the kill window of a signalled run over? A run SIGKILLed without a SIGTERM (store.signal
    called outside the plan) has no window: at once."""
    return lr.term_ts is None or now - lr.term_ts >= ra.kill_window_s


def stale_logs(last_write: dict[str, float], jobs_here: set[str], now: float, retention_s: float) -> list[str]:
    """Jobs whose log folder on this node may go: nothing written for ``retention_s`` and no run
    of the job left on the node (0 or less: keep everything)."""
    if retention_s <= 0:
        return []
    return sorted(j for j, ts in last_write.items() if ts < now - retention_s and j not in jobs_here)
