"""Node liveness as one controller replica sees it, from the heartbeat records in ``hfai_nodes``.

Liveness uses this replica's own monotonic clock (when it last saw the record change), never the
timestamps agents write, so clock skew between hosts cannot make a node look dead or alive.
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping

from hfai.core.clock import SYSTEM, Clock
from hfai.kv import KVCache
from hfai.protocol import names
from hfai.protocol.types import ChainState, DrainedNodes, JobRecord, NodeInfo, NodeRecord, NodeState


def node_state(last_seen: float | None, now: float, timeout_s: float, fatal_gpu: bool = False) -> NodeState:
    """Pure: UP while heartbeats are fresh and no GPU reports a fatal error; DOWN otherwise."""
    if last_seen is None or now - last_seen > timeout_s or fatal_gpu:
        return NodeState.DOWN
    return NodeState.UP


class NodeTracker:
    """The nodes as the leader sees them: heartbeats (``cache.seen``, on ``clock``: the cache's
    own) and drains."""

    def __init__(self, cache: KVCache[NodeRecord], heartbeat_timeout_s: float, settings: KVCache | None = None,
                 clock: Clock = SYSTEM):
        self.cache = cache
        self.clock = clock
        self.timeout_s = heartbeat_timeout_s
        self.settings = settings

    def drained(self) -> dict[str, str]:
        """node -> reason, for nodes an operator took out of service, or whose agent drained
        them itself (NodeRecord.drain_reason: its state directory is full, ...); an operator's
        reason comes first."""
        d = self.settings.values.get(names.DRAINED_KEY) if self.settings is not None else None
        by_agent = {r.name: r.drain_reason for r in self.cache.values.values() if r.drain_reason}
        return by_agent | dict(d.nodes) if isinstance(d, DrainedNodes) else by_agent

    def schedulable(self, name: str, now: float | None = None) -> bool:
        return self.state(name, now) is NodeState.UP and name not in self.drained()

    def records(self) -> list[NodeRecord]:
        return list(self.cache.values.values())

    def heartbeating(self, name: str, now: float | None = None) -> bool:
        """Its heartbeat is fresh (whatever its GPUs say)."""
        return node_state(self.cache.seen.get(name), self.clock.monotonic() if now is None else now,
                          self.timeout_s) is NodeState.UP

    def state(self, name: str, now: float | None = None) -> NodeState:
        record = self.cache.values.get(name)
        fatal = record is not None and any(g.fatal for g in record.gpus)
        return node_state(self.cache.seen.get(name), self.clock.monotonic() if now is None else now, self.timeout_s,
                          fatal)

    def infos(self, jobs: Iterable[JobRecord]) -> list[NodeInfo]:
        """Every node as `hfai nodes` shows it, by name."""
        now = self.clock.monotonic()
        on_node = jobs_on_nodes(jobs)
        drained = self.drained()
        return [self.info(r, now, on_node, drained) for r in sorted(self.records(), key=lambda r: r.name)]

    def info(self, r: NodeRecord, now: float, on_node: Mapping[str, list[str]], drained: Mapping[str, str]) -> NodeInfo:
        """One node as `hfai nodes` shows it, at monotonic time ``now`` (``on_node``: see
        :func:`jobs_on_nodes`; ``drained``: see :meth:`drained`)."""
        return NodeInfo(record=r, state=shown_state(self.state(r.name, now), r.name in drained),
                        age_s=now - self.cache.seen.get(r.name, now),
                        jobs=tuple(on_node.get(r.name, ())), reason=drained.get(r.name, ""))


# The states of jobs that hold their nodes (ChainState.holds_nodes), for scans of every record:
# a page of `hfai nodes` looks at each job kept (finished ones for 30 days), and a tuple test
# costs a quarter of the property.
_HOLDING = tuple(s for s in ChainState if s.holds_nodes)


def jobs_on_nodes(jobs: Iterable[JobRecord]) -> dict[str, list[str]]:
    """Pure: node -> ids of the jobs holding it."""
    on_node: dict[str, list[str]] = {}
    for j in jobs:
        if j.state in _HOLDING:
            for n in j.nodes:
                on_node.setdefault(n, []).append(j.id)
    return on_node


def unknown_nodes(jobs: Iterable[JobRecord], known: Container[str], led_s: float, timeout_s: float) -> set[str]:
    """Pure: nodes held by jobs that no heartbeat record names (forgotten, as ``hfai local up``
    does with the nodes of an earlier, larger cluster): nothing can run there, so they count as
    down, but only once this leader has led for a heartbeat window (``led_s`` > ``timeout_s``),
    the same grace a takeover gives every node, so a record that is merely late loses nothing."""
    if led_s <= timeout_s:
        return set()
    return {n for j in jobs if j.state.holds_nodes for n in j.nodes if n not in known}


def shown_state(live: NodeState, drained: bool) -> NodeState:
    """Pure: DOWN outranks DRAINED, so a drained node that stopped answering is not shown with its
    last figures as if current (the drain reason still travels in ``NodeInfo.reason``)."""
    return NodeState.DRAINED if drained and live is NodeState.UP else live
