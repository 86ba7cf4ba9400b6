"""Operator operations on one node's agent, requested over NATS (``hfai.agent.<node>.op.<user>.<verb>``).

``suspend``: interrupt every run on the node as the platform does and start nothing more until the
agent restarts: the node is going down (``hfai local down`` asks every agent before it stops
them). The interrupts are the agent's own: :meth:`Operations.wanted` turns what the agent wants
into suspended runs, and the reconcile loop raises the flags, signals and reports them exactly as
when the leader suspends a run. Only operators may publish on these subjects (hfai.auth.roles);
the subject names the operator.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from hfai.agent.plan import LocalRun, RunPhase
from hfai.agent.runs import RunStore
from hfai.core import nats as _nats
from hfai.core.clock import SYSTEM, Clock
from hfai.protocol import decode, names
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import (
    DesiredRun,
    NodeSuspendReply,
    NodeSuspendRequest,
    RunAssignment,
    RunEventKind,
)

log = logging.getLogger(__name__)


@dataclass
class Hold:
    """A node an operator suspended: the windows its interrupts get (None: each run's own), and
    the runs it interrupts (every one alive since it began)."""

    ack_window_s: float | None = None
    kill_window_s: float | None = None
    runs: set[str] = field(default_factory=set)

    def suspended(self, ra: RunAssignment) -> RunAssignment:
        """``ra`` as the leader would send it to suspend the run, with the hold's windows. A run
        the leader is stopping is left to stop."""
        if ra.desired is DesiredRun.STOP:
            return ra
        return dataclasses.replace(
            ra, desired=DesiredRun.SUSPEND,
            ack_window_s=ra.ack_window_s if self.ack_window_s is None else self.ack_window_s,
            kill_window_s=ra.kill_window_s if self.kill_window_s is None else self.kill_window_s)


def held(hold: Hold, desired: dict[str, RunAssignment], local: dict[str, LocalRun]) -> dict[str, RunAssignment]:
    """Pure: what the agent plans from under ``hold``: every desired run, and every run alive on
    the node that is no longer desired, suspended; ``hold.runs`` learns the live ones."""
    alive = {key: run.assignment for key, run in local.items() if run.phase is RunPhase.ALIVE}
    hold.runs.update(alive)
    return {key: hold.suspended(ra) for key, ra in {**alive, **desired}.items()}


def unsettled(hold: Hold, local: dict[str, LocalRun]) -> tuple[str, ...]:
    """Pure: the runs ``hold`` interrupts that have not yet ended with their end reported (a run
    directory that is gone was reported and cleaned up)."""
    return tuple(sorted(key for key in hold.runs if key in local and RunEventKind.EXITED not in local[key].sent))


class Operations:
    """The operator operations of the agent of ``node``; ``wake`` asks its reconcile loop for a
    plan now, and ``poll_s`` is how often a waiting request looks at ``store`` (on ``clock``)."""

    def __init__(self, node: str, store: RunStore, wake: Callable[[], None], poll_s: float, clock: Clock = SYSTEM):
        self.node = node
        self.clock = clock
        self.store = store
        self.wake = wake
        self.poll_s = max(0.05, poll_s)
        self.hold: Hold | None = None

    async def serve(self, nc) -> None:
        """Answer this node's operation requests on ``nc`` (until it is drained)."""
        for verb in names.AGENT_OPS:
            await nc.subscribe(names.agent_op_wildcard(self.node, verb), cb=self._on_request)

    def wanted(self, desired: dict[str, RunAssignment], local: dict[str, LocalRun]) -> dict[str, RunAssignment]:
        """What the agent's plan works from: ``desired`` itself, or every run suspended under a hold."""
        return desired if self.hold is None else held(self.hold, desired, local)

    async def _on_request(self, msg) -> None:
        await _nats.answer(msg, self._dispatch, "agent operation")

    async def _dispatch(self, subject: str, data: bytes) -> NodeSuspendReply:
        node, user, verb = names.parse_agent_op_subject(subject)
        if node != self.node or verb not in names.AGENT_OPS:
            raise InvalidRequest(f"no operation {verb!r} on node {node!r} here")
        return await self.suspend(user, decode(data, NodeSuspendRequest))

    async def suspend(self, operator: str, req: NodeSuspendRequest) -> NodeSuspendReply:
        """Hold the node suspended (the windows of the newest request) and answer once its runs are
        settled or ``req.wait_s`` passed."""
        if self.hold is None:
            log.warning("operator %s suspends every run on this node; it starts nothing more until the agent "
                        "restarts", operator)
            self.hold = Hold()
        self.hold.ack_window_s, self.hold.kill_window_s = req.ack_window_s, req.kill_window_s
        held(self.hold, {}, self.store.snapshot())  # the runs alive now are the interrupted ones
        self.wake()
        deadline = self.clock.monotonic() + max(0.0, req.wait_s)
        left = unsettled(self.hold, self.store.snapshot())
        while left and self.clock.monotonic() < deadline:
            await self.clock.sleep(min(self.poll_s, max(0.0, deadline - self.clock.monotonic())))
            left = unsettled(self.hold, self.store.snapshot())
        return NodeSuspendReply(node=self.node, interrupted=tuple(sorted(self.hold.runs)), unsettled=left)
