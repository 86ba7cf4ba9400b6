"""The leader's view of heartbeats runs on its injected clock all the way down: the KV cache stamps
each node record's arrival on that clock, and the node tracker reads the same one, so a test (or a
replica) moves one clock and the whole view follows, with no real wait."""

from __future__ import annotations

from types import SimpleNamespace

from fakes import FakeKV

from hfai.controller.nodes import NodeState, NodeTracker
from hfai.core.clock import FakeClock
from hfai.kv import KVCache
from hfai.protocol import encode
from hfai.protocol.types import NodeRecord

TIMEOUT_S = 10.0


def _beat(cache: KVCache, name: str, revision: int) -> None:
    """A heartbeat as the bucket's watch delivers it."""
    record = NodeRecord(name=name, group="g", address="10.0.0.1", ts=1.0, seq=revision)
    cache._apply(SimpleNamespace(key=name, revision=revision, operation=None, value=encode(record), delta=0))


def test_a_node_is_lost_once_its_heartbeats_are_older_than_the_timeout_on_the_injected_clock():
    clock = FakeClock()
    cache: KVCache[NodeRecord] = KVCache(FakeKV(), NodeRecord, clock=clock)
    nodes = NodeTracker(cache, TIMEOUT_S, clock=clock)
    _beat(cache, "n0", 1)
    assert cache.seen["n0"] == clock.monotonic()
    assert nodes.state("n0") is NodeState.UP

    clock.now += TIMEOUT_S - 1  # quiet, but within the timeout
    assert nodes.state("n0") is NodeState.UP and nodes.heartbeating("n0")
    _beat(cache, "n0", 2)  # a fresh heartbeat, stamped on the same clock
    clock.now += TIMEOUT_S - 1
    assert nodes.state("n0") is NodeState.UP

    clock.now += 2  # past the timeout since the last heartbeat
    assert nodes.state("n0") is NodeState.DOWN and not nodes.heartbeating("n0")
    info = nodes.infos([])[0]
    assert info.age_s == TIMEOUT_S + 1
