"""Compare-and-set from a live copy (kv/cas.py ``cas_value(cached=...)``): the leader
writes without reading first when its copy is current, and is never misled when it is not."""

from __future__ import annotations

import asyncio

import nats

from hfai.kv import cas_value
from hfai.protocol import decode, encode
from hfai.protocol.types import DrainedNodes


def _drain(node):
    return lambda d: DrainedNodes(nodes={**d.nodes, node: "r"})


def test_a_current_copy_saves_the_read_and_a_stale_one_costs_only_a_retry(nats_url):
    async def go(url):
        nc = await nats.connect(url)
        kv = await nc.jetstream().create_key_value(bucket="t", history=1)
        rev = await kv.create("d", encode(DrainedNodes(nodes={"n0": "r"})))
        reads = []
        real_get = kv.get

        async def get(key, *a, **k):
            reads.append(key)
            return await real_get(key, *a, **k)

        kv.get = get

        # Current copy: written at once, no read.
        current = DrainedNodes(nodes={"n0": "r"})
        value, rev2, changed = await cas_value(kv, "d", DrainedNodes, _drain("n1"), what="s", cached=(current, rev))
        assert changed and reads == [] and value.nodes == {"n0": "r", "n1": "r"} and rev2 > rev

        # Stale copy (another writer came since): the write is refused, the key read, the change
        # made on what is there.
        value, rev3, changed = await cas_value(kv, "d", DrainedNodes, _drain("n2"), what="s", cached=(current, rev))
        assert changed and reads == ["d"] and value.nodes == {"n0": "r", "n1": "r", "n2": "r"}
        assert decode((await real_get("d")).value, DrainedNodes) == value

        # A change of nothing on the copy is confirmed on a fresh read: the stale copy lacks n2,
        # which the current value has, so "already drained" holds only there.
        reads.clear()

        def drain_n2_unless_there(d):
            return None if "n2" in d.nodes else _drain("n2")(d)

        stale = DrainedNodes(nodes={"n0": "r", "n2": "r"})  # says: nothing to do
        same, rev4, changed = await cas_value(kv, "d", DrainedNodes, drain_n2_unless_there, what="s",
                                              cached=(stale, rev))
        assert reads == ["d"] and not changed and rev4 == rev3 and same == value

        def drop_n1(d):
            return DrainedNodes(nodes={k: v for k, v in d.nodes.items() if k != "n1"}) if "n1" in d.nodes else None

        # ... and the other way round: nothing to do on the copy, something on the record.
        reads.clear()
        gone = DrainedNodes(nodes={"n0": "r"})  # the copy says n1 is not there
        value, _, changed = await cas_value(kv, "d", DrainedNodes, drop_n1, what="s", cached=(gone, rev3))
        assert reads == ["d"] and changed and value.nodes == {"n0": "r", "n2": "r"}
        await nc.close()

    asyncio.run(go(nats_url))
