"""A CLI call through a NATS server cut off from its cluster (issue 38 §7): three routed JetStream
servers with R3 buckets and authentication, a controller and an agent on two of them, and a user's
client given all three URLs that connects to the third, which is then cut off
(tests/cutoff_cluster.py: its routes silently drop what it forwards). A list and a submit through
it are answered through another server (hfai.api.client: ApiClient._move), not after the request
timeout with "no answer", and the submit, whose first copy went into the cut, makes one job."""

from __future__ import annotations

import asyncio
import dataclasses

import nats.aio.client
import pytest
from cutoff_cluster import PartitionableCluster
from spine_cluster import Cluster
from waits import wait_for

from hfai.api.client import ApiClient
from hfai.cli.local import LocalCluster
from hfai.protocol.errors import Unavailable
from hfai.protocol.types import JobSpec

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
CUT = 0  # the server the user's client is connected to, and the one cut off


def test_a_cli_call_through_a_cut_off_server_is_answered_through_another(tmp_path, monkeypatch):
    issuer_of = LocalCluster(root=tmp_path / "hfai")  # the cluster's issuer, made before its servers
    with PartitionableCluster(tmp_path / "nats", auth=issuer_of.server_auth_config) as nats_servers:
        others = ",".join(u for i, u in enumerate(nats_servers.urls) if i != CUT)
        with Cluster(tmp_path / "hfai", nodes=1, controllers=1, nats_url=others, replicas=3) as c:
            c.creds("tester")
            nats_servers.cut(CUT)
            spec = JobSpec(name="warm-up", entrypoint=("true",), workdir=str(tmp_path), nodes=1, priority=0)

            def writes():  # the buckets' leaders on server 0 are replaced by the other two
                try:
                    return c.run(lambda api: api.submit(dataclasses.replace(spec), force=True))
                except Unavailable:
                    return None

            wait_for(writes, 90.0, "a submit through the servers that are not cut off")
            # The user's client lists all three servers, the cut one first, and tries them in order.
            monkeypatch.setattr(nats.aio.client, "shuffle", lambda pool: None)
            everywhere = dataclasses.replace(c.config, nats=dataclasses.replace(c.config.nats, url=nats_servers.url))

            async def through_the_cut():
                async with ApiClient(everywhere, user="tester") as api:
                    assert api._conn.connected_url is not None
                    first = nats_servers.index_of(api._conn.connected_url.netloc)
                    listed = await api.list()
                    job = await api.submit(dataclasses.replace(spec, name="through-the-cut"))
                    assert api._conn.connected_url is not None
                    return first, nats_servers.index_of(api._conn.connected_url.netloc), listed, job

            first, then, listed, job = asyncio.run(through_the_cut())
            assert first == CUT and then != CUT
            assert any(j.spec.name == "warm-up" for j in listed)
            made = [j for j in c.run(lambda api: api.list()) if j.spec.name == "through-the-cut"]
            assert [j.id for j in made] == [job.id]
