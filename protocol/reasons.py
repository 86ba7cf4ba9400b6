"""Why a job is where it is, as a typed value: a :class:`Reason` is a code and its parameters.

The controller produces these (controller/policy/, controller/plan.py, controller/transitions.py,
controller/api.py at submit) and stores one in the job record next to the text (``JobRecord.why``
and ``JobEvent.why``); what a reason *says* is decided here once, by :func:`render`,
and read at the edges (the CLI, the web pages). Code that needs to know what a reason means
compares its ``code`` and reads its ``params``; nothing parses the words back. A reason given
only as words (``why`` is None) is shown as it is by :func:`describe`.

Each code has a builder here, named as the code (``reasons.preempted(job=..., priority=...,
victim_priority=...)``), whose keyword parameters are the code's, typed: a missing or misspelt
parameter is a type error where the reason is made. Every reason is made by one of them.

Parameters are strings on the wire (numbers as written by ``str``), so a reader never meets a type
it did not expect; a code this side does not know (a newer controller's) renders as the text the
record carries.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Literal, Protocol

from hfai.protocol._lazy import frozen_dataclass


class ReasonCode(enum.StrEnum):
    """What a reason is about; its parameters are its builder's (below)."""

    # -- the policy: why a job waits
    TOO_BIG = "too_big"
    OVER_QUOTA = "over_quota"
    QUOTA_CLOSED = "quota_closed"
    NO_NODES = "no_nodes"
    NOT_PREEMPTIBLE = "not_preemptible"
    TIME_SLICE_WAIT = "time_slice_wait"
    OWN_SESSION = "own_session"
    BEHIND_OWN_JOB = "behind_own_job"
    RELEASING = "releasing"
    PREEMPTING = "preempting"
    # -- the policy: why a running job is interrupted or resized
    PREEMPTED = "preempted"
    TIME_SLICE = "time_slice"
    GROWS = "grows"
    # -- the plan: gates and the platform's own interruptions
    UNACKED = "unacked"
    RESTRICTED = "restricted"
    RESTRICTED_INTERRUPT = "restricted_interrupt"
    GPU_ERROR = "gpu_error"
    GPU_FAULT = "gpu_fault"
    HELD = "held"
    RETRY_BACKOFF = "retry_backoff"
    AFTER = "after"
    ARRAY_LIMIT = "array_limit"
    TIME_LIMIT = "time_limit"
    DEPENDENCY_FAILED = "dependency_failed"
    # -- transitions: how runs begin and end (the timeline reads these)
    STARTED = "started"
    RESUMED = "resumed"
    ACKNOWLEDGED = "acknowledged"
    NOT_ACKNOWLEDGED = "not_acknowledged"
    NODE_LOST = "node_lost"
    PLATFORM_STOPPED = "platform_stopped"
    EXITED = "exited"
    OUT_OF_MEMORY = "out_of_memory"
    HUNG = "hung"
    START_FAILED = "start_failed"
    FINISHED_SUSPENDING = "finished_suspending"
    SUCCEEDED = "succeeded"
    EXIT_CODES = "exit_codes"
    # -- people: who did what to the job
    SUBMITTED = "submitted"
    QUEUED = "queued"
    STOPPED_BY = "stopped_by"
    REQUEUED_BY = "requeued_by"
    RELEASED = "released"
    # -- a reason that is only words (the simulator's baseline policies give these)
    TEXT = "text"
    # -- development sessions (docs/dev.md): how one ends that the user did not stop
    DEV_IDLE = "dev_idle"
    DEV_NODE_LOST = "dev_node_lost"


@frozen_dataclass
class Reason:
    """One reason: ``code`` (a :class:`ReasonCode` value) and its parameters."""

    code: str
    params: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        return render(self)

    def gist(self) -> tuple[str, ...]:
        """What the reason says without the detail that changes from round to round (the leader
        rewrites a waiting job's reason only when this changes): the code, and for a countdown
        (a time-slice turn) its figure, which is the news."""
        keep = _GIST_PARAMS.get(self.code, ())
        return (self.code, *(self.params.get(k, "") for k in keep))


def _reason(code: ReasonCode, /, **params: object) -> Reason:
    """A :class:`Reason` with its parameters written as strings; a parameter given as None is left
    out (its code's words read it as absent)."""
    return Reason(code.value, {k: v if type(v) is str else str(v) for k, v in params.items() if v is not None})


# -- Each code's builder: its parameters, typed. Every reason the platform gives is made by one of
# these (tests/test_reasons.py checks that each builder writes exactly what its code's words read).
# Optional parameters left at their default are not written; a flag is written "1" when set.

# The policy: why a job waits.


def too_big(*, need: int, group: str, usable: int) -> Reason:
    """The job needs more nodes than its group has in service."""
    return _reason(ReasonCode.TOO_BIG, need=need, group=group, usable=usable)


def over_quota(*, user: str, priority: str, group: str, held: int, limit: int, need: int) -> Reason:
    return _reason(ReasonCode.OVER_QUOTA, user=user, priority=priority, group=group, held=held, limit=limit,
                   need=need)


def quota_closed(*, user: str, priority: str, group: str, closed_above: str, job: str) -> Reason:
    """``priority`` (a label) needs a quota the user does not have: levels above ``closed_above``
    are closed until an operator sets one."""
    return _reason(ReasonCode.QUOTA_CLOSED, user=user, priority=priority, group=group, closed_above=closed_above,
                   job=job)


def no_nodes(*, reserved: bool) -> Reason:
    """No node left and none to preempt: ``reserved``, the free ones are pinned for jobs ahead of
    it; otherwise the group is full."""
    return _reason(ReasonCode.NO_NODES, reserved="1" if reserved else "")


def not_preemptible(*, need: int) -> Reason:
    return _reason(ReasonCode.NOT_PREEMPTIBLE, need=need)


def time_slice_wait(*, minutes: int) -> Reason:
    """Its time slice comes in about ``minutes``."""
    return _reason(ReasonCode.TIME_SLICE_WAIT, minutes=minutes)


def own_session(*, job: str, name: str, nodes: str, priority: str, minutes: int | None = None) -> Reason:
    """Its user's development session (``job``, ``name``, at ``priority``) holds ``nodes`` (", "-joined)
    that it lacks; ``minutes``: its time slice's turn, if one comes."""
    return _reason(ReasonCode.OWN_SESSION, job=job, name=name, nodes=nodes, priority=priority, minutes=minutes)


def behind_own_job() -> Reason:
    return _reason(ReasonCode.BEHIND_OWN_JOB)


def releasing() -> Reason:
    return _reason(ReasonCode.RELEASING)


def preempting() -> Reason:
    return _reason(ReasonCode.PREEMPTING)


# The policy: why a running job is interrupted or resized. ``size``: the size a victim shrinks to
# instead; ``lost``: what the nodes it gives up added, % of its throughput in ``unit`` (the gain
# policy's speedup curve says).


def preempted(*, job: str, priority: str, victim_priority: str, size: int | None = None, lost: int | None = None,
              unit: str = "") -> Reason:
    """For job ``job`` of a higher priority (both are labels)."""
    return _reason(ReasonCode.PREEMPTED, job=job, priority=priority, victim_priority=victim_priority, size=size,
                   lost=lost, unit=unit or None)


def time_slice(*, job: str, minutes: float, size: int | None = None, lost: int | None = None,
               unit: str = "") -> Reason:
    """Yields to job ``job`` of its priority after holding its nodes ``minutes``."""
    return _reason(ReasonCode.TIME_SLICE, job=job, minutes=f"{minutes:.1f}", size=size, lost=lost, unit=unit or None)


def grows(*, held: int, size: int, gain: int | None = None, unit: str = "") -> Reason:
    """From ``held`` to ``size`` nodes; ``gain``: % more throughput expected, in ``unit``."""
    return _reason(ReasonCode.GROWS, held=held, size=size, gain=gain, unit=unit or None)


# The plan: gates and the platform's own interruptions.


def unacked(*, job: str, since: float, stop_at: float, kill_at: float, late: bool) -> Reason:
    """Job ``job`` was asked to release its nodes at ``since`` and has not acknowledged; the
    platform stops it at ``stop_at`` and kills it at ``kill_at`` (``late``: past ``stop_at``)."""
    return _reason(ReasonCode.UNACKED, job=job, since=since, stop_at=stop_at, kill_at=kill_at,
                   late="1" if late else "")


def restricted(*, why: str) -> Reason:
    """The job's user is restricted; ``why`` ("": by an operator, who gave none)."""
    return _reason(ReasonCode.RESTRICTED, why=why)


def restricted_interrupt(*, user: str, why: str) -> Reason:
    return _reason(ReasonCode.RESTRICTED_INTERRUPT, user=user, why=why)


def gpu_error(*, node: str, fault: str = "") -> Reason:
    """``fault``: what the node's health watch saw, rendered."""
    return _reason(ReasonCode.GPU_ERROR, node=node, fault=fault or None)


def gpu_fault(*, gpu: int, meaning: str, kind: str, xid: int | None = None, node: str | None = None) -> Reason:
    """A GPU fault; ``kind``: its class ("hardware", "application", "warn"); ``node``: where, in a
    job's history (:func:`at_node`)."""
    return _reason(ReasonCode.GPU_FAULT, gpu=gpu, meaning=meaning, kind=kind, xid=xid, node=node)


def at_node(fault: Reason, node: str) -> Reason:
    """A node's fault (:func:`gpu_fault`, or :func:`text` for a failed health check) as a job's
    history keeps it: with the node it happened on."""
    return Reason(fault.code, {**fault.params, "node": node})


def held(*, by: str, job: str) -> Reason:
    return _reason(ReasonCode.HELD, by=by, job=job)


def retry_backoff(*, retried: int, retries: int, seconds: int) -> Reason:
    return _reason(ReasonCode.RETRY_BACKOFF, retried=retried, retries=retries, seconds=seconds)


def after(*, job: str, until: Literal["succeed", "end"]) -> Reason:
    return _reason(ReasonCode.AFTER, job=job, until=until)


def array_limit(*, array: str, limit: int, running: int, ahead: int) -> Reason:
    """``running``: its members holding nodes; ``ahead``: members let start before this one."""
    return _reason(ReasonCode.ARRAY_LIMIT, array=array, limit=limit, running=running, ahead=ahead)


def time_limit(*, ran: str, limit: str) -> Reason:
    """Both as H:MM:SS."""
    return _reason(ReasonCode.TIME_LIMIT, ran=ran, limit=limit)


def dependency_failed(*, job: str, state: str) -> Reason:
    """``state``: how job ``job`` ended."""
    return _reason(ReasonCode.DEPENDENCY_FAILED, job=job, state=state)


# Transitions: how runs begin and end (the timeline reads these). ``nodes``: ", "-joined, rank order.


def started(*, nodes: str) -> Reason:
    return _reason(ReasonCode.STARTED, nodes=nodes)


def resumed(*, nodes: str) -> Reason:
    return _reason(ReasonCode.RESUMED, nodes=nodes)


def acknowledged(*, cause: str) -> Reason:
    """Every rank acknowledged the interruption ``cause`` (its words)."""
    return _reason(ReasonCode.ACKNOWLEDGED, cause=cause)


def not_acknowledged(*, cause: str) -> Reason:
    """Some rank was stopped after the interrupt windows."""
    return _reason(ReasonCode.NOT_ACKNOWLEDGED, cause=cause)


def node_lost(*, node: str, cause: str | None = None) -> Reason:
    """``cause``: the stop it ended; without one the job is requeued."""
    return _reason(ReasonCode.NODE_LOST, node=node, cause=cause)


def platform_stopped(*, rank: int, node: str, message: str, requeued: bool = False) -> Reason:
    """``requeued``: every rank had exited."""
    return _reason(ReasonCode.PLATFORM_STOPPED, rank=rank, node=node, message=message,
                   requeued="1" if requeued else None)


def exited(*, rank: int, node: str, code: int, retry: tuple[int, int] | None = None) -> Reason:
    """Exited with ``code`` (not 0); ``retry``: the retry it gets, of how many (--retry)."""
    nth, of = retry or (None, None)
    return _reason(ReasonCode.EXITED, rank=rank, node=node, code=code, retry=nth, retries=of)


def out_of_memory(*, rank: int, node: str, limit: int) -> Reason:
    """``limit``: the run's memory limit, bytes."""
    return _reason(ReasonCode.OUT_OF_MEMORY, rank=rank, node=node, limit=limit)


def hung(*, rank: int, node: str, silent_s: float, restart: tuple[int, int] | None = None) -> Reason:
    """Silent for ``silent_s`` (its watchdog time); ``restart``: the restart it gets, of how many."""
    nth, of = restart or (None, None)
    return _reason(ReasonCode.HUNG, rank=rank, node=node, silent_s=silent_s, restart=nth, restarts=of)


def start_failed(*, node: str, message: str) -> Reason:
    return _reason(ReasonCode.START_FAILED, node=node, message=message)


def finished_suspending() -> Reason:
    """Every rank exited 0 before it saw the interrupt."""
    return _reason(ReasonCode.FINISHED_SUSPENDING)


def succeeded() -> Reason:
    return _reason(ReasonCode.SUCCEEDED)


def exit_codes(*, codes: str) -> Reason:
    """``codes``: "node=code, ...", rank order."""
    return _reason(ReasonCode.EXIT_CODES, codes=codes)


# People: who did what to the job.


def submitted(*, by: str) -> Reason:
    return _reason(ReasonCode.SUBMITTED, by=by)


def queued() -> Reason:
    return _reason(ReasonCode.QUEUED)


def stopped_by(*, by: str) -> Reason:
    return _reason(ReasonCode.STOPPED_BY, by=by)


def requeued_by(*, by: str) -> Reason:
    return _reason(ReasonCode.REQUEUED_BY, by=by)


def released(*, by: str) -> Reason:
    return _reason(ReasonCode.RELEASED, by=by)


def text(*, text: str) -> Reason:
    """A reason that is only words (the simulator's baseline policies, a failed health check)."""
    return _reason(ReasonCode.TEXT, text=text)


# Development sessions (docs/dev.md): how one ends that the user did not stop.


def dev_idle(*, idle_s: float) -> Reason:
    """Its JupyterLab stopped itself after ``idle_s`` without activity."""
    return _reason(ReasonCode.DEV_IDLE, idle_s=f"{idle_s:g}")


def dev_node_lost(*, node: str, message: str | None = None) -> Reason:
    """Lost with its node, or (``message``) the platform stopped it there; never requeued."""
    return _reason(ReasonCode.DEV_NODE_LOST, node=node, message=message)


def _utc(ts: str) -> str:
    return time.strftime("%H:%M:%S UTC", time.gmtime(float(ts)))


def _rate(p: Mapping[str, str]) -> str:
    """What a resize's gain is measured in: the job's unit per second where it was measured."""
    return f"{p['unit']}/s" if p.get("unit") else "throughput"


def _shrinks(p: Mapping[str, str]) -> str:
    if not p.get("size"):
        return ""
    # What the nodes it gives up added, by its measured speedup curve.
    lost = f" (the nodes it gives up added {p['lost']}% {_rate(p)})" if p.get("lost") else ""
    return f": shrinks to {p['size']} node(s){lost}"


def _unacked(p: Mapping[str, str]) -> str:
    since, stop_at = _utc(p["since"]), _utc(p["stop_at"])
    if not p.get("late"):
        return (f"waiting for job {p['job']} to release its nodes: it has not acknowledged its interrupt "
                f"(asked at {since}); the platform stops it at {stop_at} if it does not")
    return (f"waiting for job {p['job']} to release its nodes: it did not acknowledge its interrupt (asked at "
            f"{since}); stopped at {stop_at}, killed at {_utc(p['kill_at'])} if still running")


def _span(seconds: str) -> str:
    """``14400`` as ``4 h``, ``5400`` as ``1.5 h``, ``600`` as ``10 min``."""
    s = float(seconds)
    if s >= 3600:
        return f"{round(s / 3600, 1):g} h"
    return f"{round(s / 60, 1):g} min" if s >= 60 else f"{s:g} s"


def _bytes(n: int) -> str:
    """A memory size as people say it: 96 GiB, 1.5 GiB, 200 MiB."""
    if n >= 2**30:
        return f"{n / 2**30:.1f}".removesuffix(".0") + " GiB"
    return f"{n / 2**20:.0f} MiB"


def _array_limit(p: Mapping[str, str]) -> str:
    limit = p["limit"]
    if p.get("ahead", "0") != "0":  # fewer run than the limit: the members before this one start first
        return (f"its job array {p['array']} runs at most {limit} member(s) at once (--array ...%{limit}): "
                f"{p.get('running', '0')} running, {p['ahead']} waiting ahead of this one")
    return f"its job array {p['array']} already runs {p.get('running', limit)} member(s) (--array ...%{limit})"


def _dev_lost(p: Mapping[str, str]) -> str:
    if p.get("message"):
        return f"the platform stopped it on {p['node']}: {p['message']}"
    return f"node {p['node']} lost (no heartbeat)"


#: What each class of GPU fault means for the node and the job (agent/health.py classifies).
_FAULT_KINDS = {"hardware": " (hardware: the node drains)",
                "application": " (the job's own error: the node stays in service)", "warn": ""}


def _gpu_fault(p: Mapping[str, str]) -> str:
    """``Xid 79 on GPU 3: fell off the bus``; in a job's history (with the node) also what it
    means for the node: ``Xid 13 on GPU 0 of node-1: ... (the job's own error: ...)``."""
    node = p.get("node")
    where = f"GPU {p['gpu']}" + (f" of {node}" if node else "")
    head = f"Xid {p['xid']} on {where}" if p.get("xid") else where
    return f"{head}: {p['meaning']}" + (_FAULT_KINDS.get(p.get("kind", ""), "") if node else "")


_NO_PREEMPTION = ", and no running job may be preempted for it"

#: The words of each code (``p``: its parameters).
RENDER: dict[str, Callable[[Mapping[str, str]], str]] = {
    ReasonCode.TOO_BIG: lambda p: f"needs {p['need']} nodes, group {p['group']!r} has {p['usable']} usable",
    ReasonCode.OVER_QUOTA: lambda p: (f"over quota: user {p['user']!r} holds {p['held']} of {p['limit']} node(s) at "
                                      f"{p['priority']} in group {p['group']!r}, job needs {p['need']}"),
    ReasonCode.QUOTA_CLOSED: lambda p: (f"over quota: {p['priority']} needs a quota and user {p['user']!r} has none "
                                        f"in group {p['group']!r} (levels above {p['closed_above']} are closed "
                                        f"until an operator sets one; or hfai update {p['job']} -p NORMAL)"),
    ReasonCode.NO_NODES: lambda p: ("waiting for nodes: " + ("the free nodes are reserved for jobs ahead of it"
                                                             if p.get("reserved") else "the group is full")
                                    + _NO_PREEMPTION),
    ReasonCode.NOT_PREEMPTIBLE: lambda p: f"waiting for {p['need']} more node(s), held by jobs it may not preempt",
    ReasonCode.TIME_SLICE_WAIT: lambda p: f"waiting for its time slice, next turn in ~{p['minutes']} min",
    ReasonCode.OWN_SESSION: lambda p: (f"waiting for nodes: its user's development session {p['name']} (job "
                                       f"{p['job']}, {p['priority']}) holds {p['nodes']}; it starts when the session "
                                       f"ends (hfai dev stop {p['name']})"
                                       + (f" or at its time slice in ~{p['minutes']} min" if p.get("minutes") else "")),
    ReasonCode.BEHIND_OWN_JOB: lambda p: ("waiting behind an earlier job of the same user and priority that waits "
                                          "for nodes"),
    ReasonCode.RELEASING: lambda p: "waiting for nodes that are being released",
    ReasonCode.PREEMPTING: lambda p: "waiting for preempted jobs to checkpoint and release their nodes",
    ReasonCode.PREEMPTED: lambda p: (f"preempted by job {p['job']} (priority {p['priority']} > "
                                     f"{p['victim_priority']}){_shrinks(p)}"),
    ReasonCode.TIME_SLICE: lambda p: (f"time slice: yields to job {p['job']} of equal priority and less service so "
                                      f"far after {p['minutes']} min{_shrinks(p)}"),
    ReasonCode.GROWS: lambda p: (f"grows from {p['held']} to {p['size']} nodes into idle nodes"
                                 + (f": +{p['gain']}% {_rate(p)} expected" if p.get("gain") else "")),
    ReasonCode.UNACKED: _unacked,
    ReasonCode.RESTRICTED: lambda p: f"restricted: {p['why']}" if p.get("why") else "restricted by an operator",
    ReasonCode.RESTRICTED_INTERRUPT: lambda p: (f"interrupted: user {p['user']!r} is "
                                                f"{RENDER[ReasonCode.RESTRICTED](p)}"),
    ReasonCode.GPU_ERROR: lambda p: (f"interrupted: node {p['node']} reports a GPU error"
                                     + (f": {p['fault']}; requeued as a platform fault" if p.get("fault") else "")),
    ReasonCode.GPU_FAULT: lambda p: _gpu_fault(p),
    ReasonCode.HELD: lambda p: f"held by {p['by']} (hfai release {p['job']})",
    ReasonCode.RETRY_BACKOFF: lambda p: (f"retry {p['retried']} of {p['retries']} after a failed run: backing off, "
                                         f"starts again in ~{p['seconds']} s"),
    ReasonCode.AFTER: lambda p: f"waiting for job {p['job']} to end ({p['until']})",
    ReasonCode.ARRAY_LIMIT: lambda p: _array_limit(p),
    ReasonCode.TIME_LIMIT: lambda p: f"time limit reached: ran {p['ran']} of {p['limit']}",
    ReasonCode.DEPENDENCY_FAILED: lambda p: (f"dependency never satisfied: job {p['job']} {p['state']}, this job "
                                             f"needed it to succeed"),
    ReasonCode.STARTED: lambda p: f"started on {p['nodes']}",
    ReasonCode.RESUMED: lambda p: f"resumed on {p['nodes']}",
    ReasonCode.ACKNOWLEDGED: lambda p: f"{p['cause']}; acknowledged",
    ReasonCode.NOT_ACKNOWLEDGED: lambda p: f"{p['cause']}; stopped after the interrupt windows",
    ReasonCode.NODE_LOST: lambda p: (f"{p['cause']}; node {p['node']} lost" if p.get("cause")
                                     else f"node {p['node']} lost (no heartbeat); requeued"),
    ReasonCode.PLATFORM_STOPPED: lambda p: (f"rank {p['rank']} on {p['node']} stopped by the platform: "
                                            f"{p.get('message') or 'interrupted'}"
                                            + ("; requeued" if p.get("requeued") else "")),
    ReasonCode.EXITED: lambda p: (f"rank {p['rank']} on {p['node']} exited with code {p['code']}"
                                  + (f"; retry {p['retry']} of {p['retries']}" if p.get("retry") else "")),
    ReasonCode.OUT_OF_MEMORY: lambda p: (f"rank {p['rank']} on {p['node']} ran out of memory: the run's limit is "
                                         f"{_bytes(int(float(p['limit'])))}"),
    ReasonCode.HUNG: lambda p: (f"hung: no output for {_span(p['silent_s'])} on rank {p['rank']} ({p['node']}); "
                                f"stacks in the log"
                                + (f"; restart {p['restart']} of {p['restarts']}" if p.get("restart") else "")),
    ReasonCode.START_FAILED: lambda p: f"could not start on {p['node']}: {p['message']}",
    ReasonCode.FINISHED_SUSPENDING: lambda p: "finished while being suspended",
    ReasonCode.SUCCEEDED: lambda p: "all ranks exited 0",
    ReasonCode.EXIT_CODES: lambda p: f"exit codes {p['codes']}",
    ReasonCode.SUBMITTED: lambda p: f"submitted by {p['by']}",
    ReasonCode.QUEUED: lambda p: "queued",
    ReasonCode.STOPPED_BY: lambda p: f"stopped by {p['by']}",
    ReasonCode.REQUEUED_BY: lambda p: f"requeued by {p['by']}",
    ReasonCode.RELEASED: lambda p: f"released by {p['by']}" if p.get("by") else "released",
    ReasonCode.TEXT: lambda p: p["text"],
    ReasonCode.DEV_IDLE: lambda p: (f"stopped: idle for {_span(p['idle_s'])}" if float(p.get("idle_s") or 0) > 0
                                    else "stopped: idle (JupyterLab's [dev] idle_s)"),
    ReasonCode.DEV_NODE_LOST: lambda p: (f"stopped: {_dev_lost(p)}; start a new session with hfai dev start "
                                         "(the notebooks are kept)"),
}

#: Parameters that are part of a code's gist (see :meth:`Reason.gist`).
_GIST_PARAMS: dict[str, tuple[str, ...]] = {ReasonCode.TIME_SLICE_WAIT: ("minutes",),
                                             ReasonCode.OWN_SESSION: ("job", "minutes")}


def render(why: Reason, fallback: str = "") -> str:
    """The words of a reason; ``fallback`` (the record's text) for a code this side does not know
    or parameters it lacks (a newer controller's)."""
    words = RENDER.get(why.code)
    if words is None:
        return fallback or why.code
    try:
        return words(why.params)
    except (KeyError, ValueError):
        return fallback or why.code


class Explained(Protocol):
    """A job record or one of its history events."""

    @property
    def reason(self) -> str: ...

    @property
    def why(self) -> Reason | None: ...


def describe(item: Explained) -> str:
    """What a record or a history event says about itself: its typed reason rendered here, or
    its text (a reason given only as words has no typed one)."""
    why = item.why
    return item.reason if why is None else render(why, item.reason)
