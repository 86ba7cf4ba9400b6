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

The grace after an ack is seconds, not a blink: a job's ack often precedes its exit by a while
(spawned workers: one rank acks, the others finish their share, then the parent joins them and its
interpreter winds down), and a SIGTERM then would turn a clean exit into "exited with code -15".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from hfai.protocol.types import DesiredRun, RunAssignment, RunEventKind


class RunPhase(enum.Enum):
    """A run on this node: ALIVE -> EXITED (exit status known or process gone)."""

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
        if lr.phase is RunPhase.ALIVE:
            # No longer wanted here (job failed elsewhere, requeued after a failover, ...).
            actions.extend(_stop(lr, now))
        elif RunEventKind.EXITED not in lr.sent:
            actions.append(Action(Act.REPORT_EXIT, key, lr.assignment))
        else:
            actions.append(Action(Act.CLEANUP, key, lr.assignment))
    return actions


def _plan_known(ra: RunAssignment, lr: LocalRun, now: float, ack_exit_grace_s: float) -> list[Action]:
    key = lr.key
    out: list[Action] = []
    if RunEventKind.STARTED not in lr.sent:
        out.append(Action(Act.REPORT_STARTED, key, ra))
    if lr.acked and RunEventKind.SUSPEND_ACKED not in lr.sent:
        out.append(Action(Act.REPORT_ACK, key, ra))
    if lr.phase is RunPhase.EXITED:
        if RunEventKind.EXITED not in lr.sent:
            out.append(Action(Act.REPORT_EXIT, key, ra))
        return out
    if ra.desired is DesiredRun.SUSPEND:
        if lr.suspend_ts is None:
            out.append(Action(Act.RAISE_SUSPEND, key, ra))
        elif lr.term_ts is None and (_ack_grace_over(lr, now, ack_exit_grace_s)
                                     or (not lr.acked and now - lr.suspend_ts >= ra.ack_window_s)):
            out.append(Action(Act.TERMINATE, key, ra))
        elif lr.term_ts is not None and now - lr.term_ts >= ra.kill_window_s:
            out.append(Action(Act.KILL, key, ra))
    elif ra.desired is DesiredRun.STOP:
        out.extend(_stop(lr, now, ra))
    return out


def _ack_grace_over(lr: LocalRun, now: float, grace_s: float) -> bool:
    if not lr.acked:
        return False
    if lr.ack_stop:
        return True
    return now - (lr.ack_ts if lr.ack_ts is not None else now) >= grace_s


def _stop(lr: LocalRun, now: float, ra: RunAssignment | None = None) -> list[Action]:
    ra = ra or lr.assignment
    if lr.term_ts is None:
        return [Action(Act.TERMINATE, lr.key, ra)]
    if now - lr.term_ts >= ra.kill_window_s:
        return [Action(Act.KILL, lr.key, ra)]
    return []


def stale_logs(last_write: dict[str, float], jobs_here: set[str], now: float, retention_s: float) -> list[str]:
    """Jobs whose log folder on this node may go: nothing written for ``retention_s`` and no run
    of the job left on the node (0 or less: keep everything)."""
    if retention_s <= 0:
        return []
    return sorted(j for j, ts in last_write.items() if ts < now - retention_s and j not in jobs_here)
