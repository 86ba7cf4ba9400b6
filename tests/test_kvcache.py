"""The controller's KV cache follows its bucket through a failed watch (real nats-server): it
watches anew, takes what changed meanwhile, and forgets keys that vanished without a marker."""

from __future__ import annotations

import asyncio

import nats
import pytest
from waits import until

from hfai.kv import KVCache
from hfai.protocol import encode
from hfai.protocol.types import StopRequest

# Starts real nats-servers: excluded by `pytest -m "not slow"`.
pytestmark = pytest.mark.slow


def test_cache_rewatches_after_its_watch_ends(nats_url):
    async def go(url):
        nc = await nats.connect(url)
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="t", history=1)
        for key in ("a", "b"):
            await kv.put(key, encode(StopRequest(job=key)))
        changed: list[str] = []
        cache = KVCache(kv, StopRequest, on_change=changed.append)
        await cache.start()
        assert set(cache.values) == {"a", "b"}
        tracked = cache.track()  # what the leader drains each round

        await cache._watcher.stop()  # the watch ends, as when its server or stream leader is lost
        await js.purge_stream("KV_t", subject="$KV.t.b")  # "b" vanishes with no delete marker
        await kv.put("c", encode(StopRequest(job="c")))
        await kv.put("a", encode(StopRequest(job="a2")))

        await until(lambda: set(cache.values) == {"a", "c"} and cache.values["a"].job == "a2", 10.0,
                    "the new watch to catch up", poll=0.1)
        assert set(cache.values) == {"a", "c"} and cache.values["a"].job == "a2", cache.values
        assert "b" in changed[2:]  # the drop was announced like any change
        await kv.put("d", encode(StopRequest(job="d")))  # and the new watch keeps following
        await until(lambda: "d" in cache.values, 5.0, "the new watch to see d", poll=0.1)
        assert tracked == {"a", "b", "c", "d"}  # changed, dropped, new: every key once
        tracked.clear()
        cache.put_local("e", StopRequest(job="e"), 10**9)  # our own write, ahead of the watch
        assert tracked == {"e"}
        cache.untrack(tracked)
        cache.put_local("f", StopRequest(job="f"), 10**9)
        assert tracked == {"e"}
        await cache.stop()
        await nc.close()

    asyncio.run(go(nats_url))
