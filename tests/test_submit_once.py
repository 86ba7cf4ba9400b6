"""A submission sent twice makes one job (issue 38 §7): the CLI sends a submit again through another
NATS server when the first server is cut off from its cluster, and the first copy may yet have
reached a controller. The request carries a name the client chose (SubmitRequest.request_id); the
job's id is derived from it, so every copy, at any replica, finds or makes the same record."""

from __future__ import annotations

from fakes import FakeKV

from hfai.controller.api import ApiService, Caller
from hfai.controller.nodes import NodeTracker
from hfai.kv import KVCache
from hfai.protocol import encode
from hfai.protocol.types import JobRecord, JobSpec, NodeRecord, SubmitRequest

SPEC = JobSpec(name="train", entrypoint=("python", "t.py"), workdir="/w", nodes=1)


def _replicas(n: int = 2) -> tuple[FakeKV, list[ApiService]]:
    """``n`` API replicas on one bucket, each with its own copy (fed only by its own writes: the
    fake bucket has no watch, as a copy that has not heard of the other's write yet)."""
    kv = FakeKV()
    node_kv = FakeKV()
    nodes = NodeTracker(KVCache(node_kv, NodeRecord), 30.0)
    n0 = NodeRecord(name="n0", group="default", address="10.0.0.1", ts=1.0, seq=1)
    nodes.cache.put_local(n0.name, n0, node_kv._put(n0.name, encode(n0)))
    return kv, [ApiService(kv, KVCache(kv, JobRecord), nodes) for _ in range(n)]


async def test_a_copy_of_a_submit_at_another_replica_makes_no_second_job():
    kv, (a, b) = _replicas()
    req = SubmitRequest(spec=SPEC, request_id="5f0c2a9d41e8b7c3")
    first = (await a.submit(Caller("alice"), req)).job
    again = (await b.submit(Caller("alice"), req)).job  # not in b's copy: found in the bucket
    same_replica = (await a.submit(Caller("alice"), req)).job  # in a's copy: no "already queued" conflict
    assert again.id == first.id == same_replica.id
    assert list(kv.messages) == [first.id]


async def test_the_name_is_the_users_own_and_unnamed_submits_stay_apart():
    kv, (a,) = _replicas(1)
    req = SubmitRequest(spec=SPEC, request_id="5f0c2a9d41e8b7c3", force=True)
    mine = (await a.submit(Caller("alice"), req)).job
    theirs = (await a.submit(Caller("bob"), req)).job
    assert mine.id != theirs.id and theirs.spec.user == "bob"
    plain = [(await a.submit(Caller("alice"), SubmitRequest(spec=SPEC, force=True))).job for _ in range(2)]
    assert plain[0].id != plain[1].id and len(kv.messages) == 4


async def test_a_job_array_sent_twice_has_each_member_once():
    kv, (a, b) = _replicas()
    req = SubmitRequest(spec=SPEC, array=(0, 1, 2), request_id="77aa01")
    first = await a.submit(Caller("alice"), req)
    again = await b.submit(Caller("alice"), req)
    assert again.array_ids == first.array_ids and len(set(first.array_ids)) == 3
    assert sorted(kv.messages) == sorted(first.array_ids)
