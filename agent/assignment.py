"""This node's desired runs: its entry in ``hfai_assign``, watched, checked, fenced.

An entry is accepted only if it decodes, names this node and passes
:func:`hfai.agent.trust.assignment_problem`, and its term fence is no older than the newest seen
(:class:`hfai.agent.fence.Fence`). Until the desired state is known (an accepted entry, or none
in KV) the agent holds: nothing is started or stopped (see :mod:`hfai.agent.executor`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hfai.agent.fence import Fence
from hfai.agent.trust import assignment_problem
from hfai.core import nats as _nats
from hfai.protocol import decode
from hfai.protocol.errors import ProtocolError
from hfai.protocol.types import NodeAssignment, RunAssignment

log = logging.getLogger(__name__)


class AssignmentWatch:
    def __init__(self, node: str, fence: Fence, changed: Callable[[], None],
                 accepted: Callable[[dict[str, RunAssignment]], None] = lambda desired: None):
        self.node = node
        self.fence = fence
        self._changed = changed  # the desired state changed, or became known: re-plan now
        self._accepted = accepted
        self.desired: dict[str, RunAssignment] = {}
        # Set once this node's desired state is known: an accepted assignment, or none in KV.
        # Until then the agent holds; a refused entry does not count as known.
        self.known = False
        self._refused_in_snapshot = False

    async def watch(self, kv) -> None:
        """Follow this node's assignment; if the watch fails or ends (a NATS server or stream
        leader lost), watch anew: a new watch delivers the current assignment first. A fence
        that cannot be saved ends the task (and so the agent)."""
        await _nats.follow(lambda: kv.watch(self.node), self.on_entry, "this node's assignment")

    def on_entry(self, entry) -> None:
        if entry is None:
            self.on_snapshot_end()
        else:
            self.on_assignment(entry)

    def on_snapshot_end(self) -> None:
        """The watch delivered what KV holds now. Nothing there means nothing is wanted here; a
        refused entry means the desired state is still unknown, so keep holding."""
        if not self._refused_in_snapshot:
            self.known = True
        self._refused_in_snapshot = False
        self._changed()

    def on_assignment(self, entry) -> None:
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            self._accept({})
            return
        try:
            a = decode(entry.value, NodeAssignment)
        except ProtocolError as e:
            return self._refuse(f"ignoring undecodable assignment: {e}")
        problem = assignment_problem(a, self.node)
        if problem:
            return self._refuse(f"refusing assignment with fence {a.fence}: {problem}")
        # An equal fence is the same leader's next write. That a stale leader cannot write one
        # (it could: a node cut off NATS keeps the old term's fence) is the server's guarantee,
        # not this check's: a leader writes each assignment by compare-and-set on a value of its
        # term or older, and stamps every node at a takeover (controller/leader.py).
        if a.fence < self.fence.value:
            return self._refuse(f"ignoring assignment with stale fence {a.fence} (newest seen {self.fence.value})")
        if a.fence > self.fence.value:
            self.fence.raise_to(a.fence)
        self._accept({r.key: r for r in a.runs})

    def _accept(self, desired: dict[str, RunAssignment]) -> None:
        self.desired = desired
        self._accepted(desired)
        self.known = True
        self._refused_in_snapshot = False
        self._changed()

    def _refuse(self, why: str) -> None:
        log.warning("%s", why)
        self._refused_in_snapshot = True
