"""A run's lifecycle on this node (pure): the state its run directory records, and the steps
between states that are legal.

The run directory's files are the truth (agent/runs.py), never the agent's memory: an agent
restarted mid-run reads the same files and so rebuilds the same state. :func:`run_state` is the
one place a state is read out of them; :meth:`RunState.check` the one place a step is allowed.

The leader's receipts of a run's start and of its acknowledgement (``started.sent``,
``suspend_acked.sent``) are not states: a run may be suspended, or exit, before its start reached
the leader, and is owed the report whatever its state (agent/plan.py sends it). Its exit's
receipt is a state (REPORTED): after it the run may be forgotten.
"""

from __future__ import annotations

import enum

from hfai.protocol.errors import IllegalTransition

__all__ = ["RunState", "run_state"]


class RunState(enum.Enum):
    """Where a run is on this node, and what it may become (who takes the step, in brackets).

    ABSENT         -> STARTING (the agent starts it), EXITED (recorded as never run here)
    STARTING       -> RUNNING (its start reported), SUSPEND_RAISED, TERMINATED, EXITED (the job)
    RUNNING        -> SUSPEND_RAISED, TERMINATED, EXITED (the job)
    SUSPEND_RAISED -> ACKNOWLEDGED (the job), TERMINATED, EXITED (the job)
    ACKNOWLEDGED   -> TERMINATED, EXITED (the job)
    TERMINATED     -> KILLED, EXITED (the job), TERMINATED (a suspend flag raised after the SIGTERM)
    KILLED         -> EXITED (the kernel), KILLED (SIGKILL again, or a suspend flag raised late)
    EXITED         -> REPORTED (its exit reported)
    REPORTED       -> ABSENT (cleaned up: the directory goes)

    Each alive state records one more of the agent's interrupts than the one before; a run is in
    the furthest it reached (a SIGTERM'd run whose job acknowledged is TERMINATED).
    """

    ABSENT = "absent"  # no run directory: never here, or forgotten
    STARTING = "starting"  # its launcher lives; the leader has not received its start yet
    RUNNING = "running"  # its start reported; the platform has not interrupted it
    SUSPEND_RAISED = "suspend_raised"  # the agent raised its suspend flag (stamp suspend_raised)
    ACKNOWLEDGED = "acknowledged"  # ... and the job acknowledged it (control/<key>/ack)
    TERMINATED = "terminated"  # the agent sent SIGTERM (stamp term)
    KILLED = "killed"  # the agent sent SIGKILL (file killed)
    EXITED = "exited"  # its exit status is known (exit_code), or its launcher is gone without one
    REPORTED = "reported"  # the leader received its exit (exited.sent)

    #: STARTING up to KILLED: its launcher lives, so its processes may.
    alive: bool

    def check(self, new: RunState) -> RunState:
        """Return ``new`` if the step self -> new is legal, else raise IllegalTransition."""
        if new not in _EDGES[self]:
            raise IllegalTransition(f"a run cannot go from {self.value} to {new.value}")
        return new


_S = RunState
_EDGES: dict[RunState, frozenset[RunState]] = {
    _S.ABSENT: frozenset({_S.STARTING, _S.EXITED}),
    _S.STARTING: frozenset({_S.RUNNING, _S.SUSPEND_RAISED, _S.TERMINATED, _S.EXITED}),
    _S.RUNNING: frozenset({_S.SUSPEND_RAISED, _S.TERMINATED, _S.EXITED}),
    _S.SUSPEND_RAISED: frozenset({_S.ACKNOWLEDGED, _S.TERMINATED, _S.EXITED}),
    _S.ACKNOWLEDGED: frozenset({_S.TERMINATED, _S.EXITED}),
    _S.TERMINATED: frozenset({_S.TERMINATED, _S.KILLED, _S.EXITED}),
    _S.KILLED: frozenset({_S.KILLED, _S.EXITED}),
    _S.EXITED: frozenset({_S.REPORTED}),
    _S.REPORTED: frozenset({_S.ABSENT}),
}
for _state in RunState:
    _state.alive = _state not in (_S.ABSENT, _S.EXITED, _S.REPORTED)
del _state


def run_state(*, exited: bool, exit_reported: bool, killed: bool, terminated: bool, suspend_raised: bool,
              acked: bool, start_reported: bool) -> RunState:
    """The state of a run directory, from what its files say (each argument is one of them:
    runs.py reads them into a LocalRun). Once a run's launcher is gone only its exit's report
    counts; while it lives, the furthest interrupt the agent stamped."""
    if exited:
        return _S.REPORTED if exit_reported else _S.EXITED
    if killed:
        return _S.KILLED
    if terminated:
        return _S.TERMINATED
    if suspend_raised:
        return _S.ACKNOWLEDGED if acked else _S.SUSPEND_RAISED
    return _S.RUNNING if start_reported else _S.STARTING
