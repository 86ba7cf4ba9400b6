"""One of three routed NATS servers cut off from the other two (issue 38 §7), on a real cluster whose
routes pass through the test's proxies (tests/cutoff_cluster.py): a daemon's connection to that
server notices within seconds and moves to another server, where its JetStream writes go through
again; the store probe of a client left on that server says "cut off", never "the store refuses
writes"."""

from __future__ import annotations

import asyncio
import logging
import time

import nats
import pytest
from cutoff_cluster import PartitionableCluster
from waits import until

from hfai.controller.store_health import StoreProbe, health_bucket
from hfai.core import nats as _nats
from hfai.core.config import Config, NatsConfig
from hfai.protocol import names

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

CHECKS = dict(cutoff_check_s=0.5, cutoff_timeout_s=0.5, cutoff_after_s=2.0, cutoff_avoid_s=60.0)
#: A bound that only a connection that never moves reaches (the partition lasts the whole test).
NEVER_S = 30.0


async def _ready(make, what: str):
    """``make()``'s result once the freshly formed cluster can place it (its meta leader settles)."""
    async def made():
        try:
            return await make()
        except (TimeoutError, nats.errors.Error):
            return None

    return await until(made, NEVER_S, f"the cluster to make {what}", poll=0.5)


async def _put_within(kv, key: str, timeout_s: float) -> bool:
    try:
        await asyncio.wait_for(kv.put(key, b"x"), timeout_s)
        return True
    except (TimeoutError, nats.errors.Error):
        return False


def test_a_daemon_leaves_a_server_cut_off_from_its_cluster_and_writes_again(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="hfai.core.cutoff")

    async def go(cluster: PartitionableCluster) -> dict[str, float]:
        config = Config(nats=NatsConfig(url=cluster.url, replicas=3, **CHECKS))
        nc = await _nats.connect(config, "test-daemon")
        try:
            # The nodes bucket, as a controller makes it: the daemons' checks ask for its stream's info.
            kv = await _ready(lambda: nc.jetstream().create_key_value(bucket=names.BUCKET_NODES, replicas=3),
                              "the nodes bucket")
            await _ready(lambda: kv.put("before", b"x"), "a first write")
            here = nc.connected_url.netloc
            cluster.cut(cluster.index_of(here))  # the server this daemon happens to be on
            cut_at = time.monotonic()
            moved_at = written_at = None
            while time.monotonic() - cut_at < NEVER_S:
                url = nc.connected_url
                if moved_at is None and url is not None and url.netloc != here:
                    moved_at = time.monotonic()
                if moved_at is not None and await _put_within(kv, "after", 1.0):
                    written_at = time.monotonic()
                    break
                await asyncio.sleep(0.1)
            assert moved_at is not None, f"still on {here}, cut off for {NEVER_S}s"
            assert written_at is not None, f"moved to {nc.connected_url.netloc}, yet no write went through"
            assert nc.connected_url.netloc != here  # the chooser kept away from the cut-off server
            return {"moved_s": moved_at - cut_at, "written_s": written_at - cut_at}
        finally:
            await nc.close()

    with PartitionableCluster(tmp_path / "nats") as cluster:
        times = asyncio.run(go(cluster))
    print(f"cut off -> reconnected elsewhere {times['moved_s']:.1f}s, -> first write {times['written_s']:.1f}s")
    assert any("cut off from its cluster" in r.getMessage() for r in caplog.records)


def test_a_probe_through_a_cut_off_server_says_so_and_raises_no_store_alarm(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="hfai.controller.store_health")

    async def go(cluster: PartitionableCluster) -> None:
        # A plain connection (no cluster checks): it stays on the cut-off server for the probes.
        nc = await nats.connect(cluster.urls[0])
        try:
            js = nc.jetstream()
            kv = await _ready(lambda: health_bucket(js, 3), "the health bucket")
            await _ready(lambda: kv.put("prober", b"x"), "a first write")
            probe = StoreProbe(js, "prober", replicas=3, every_s=0.1, timeout_s=1.5, failures_to_alarm=2)
            assert (await probe.check()).writable and probe.watch.failures == 0  # the store takes writes
            cluster.cut(0)
            for _ in range(4):
                health = await probe.check()
            assert health.writable, health
            assert probe.watch.unreachable == 4
        finally:
            await nc.close()

    with PartitionableCluster(tmp_path / "nats") as cluster:
        asyncio.run(go(cluster))
    assert not [r for r in caplog.records if r.levelno >= logging.CRITICAL], [r.getMessage() for r in caplog.records]
    assert any("cut off from its cluster, or down" in r.getMessage() for r in caplog.records)
