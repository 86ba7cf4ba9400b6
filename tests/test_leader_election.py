"""Lease election: renewal gated on the leader loop's progress, a renewal whose reply was lost is
not mistaken for losing the lease, and a holder releases only a lease that is still its own
(issue 11). On a FakeClock, against an in-memory KV that refuses a write or a delete at a wrong
revision as a JetStream bucket does (checked against a real one here); the live failovers are in
test_fault_leader.py and test_spine_failover.py."""

from __future__ import annotations

import asyncio

import nats
import nats.errors
import nats.js.errors
import pytest
from fakes import FakeKV
from nats.js.kv import KeyValue

from hfai.controller.election import LeaseElection, lease_valid, renewal_allowed
from hfai.controller.service import leader_stuck
from hfai.core.clock import FakeClock
from hfai.protocol import decode, encode, names
from hfai.protocol.types import LeaderLease

# ------------------------------------------------------------------------ the fake is faithful


async def _kv_script(kv) -> list[str]:
    """Compare-and-set moves of one key; what each returned or raised, with revisions relative to
    the first write (a real bucket's sequence need not start at 1)."""
    out: list[str] = []
    base = 0

    async def step(what: str, aw) -> int | None:
        try:
            result = await aw
        except (nats.errors.Error, nats.js.errors.Error) as e:
            code = getattr(e, "err_code", None)
            rev = getattr(getattr(e, "entry", None), "revision", None)
            out.append(f"{what}: {type(e).__name__}" + (f" {code}" if code else "") +
                       (f" at +{rev - base}" if rev else ""))
            return None
        if isinstance(result, KeyValue.Entry):
            out.append(f"{what}: {result.value!r} at +{result.revision - base}")
            return result.revision
        out.append(f"{what}: {result if isinstance(result, bool) else f'+{result - base}'}")
        return result

    base = (await kv.create("k", b"a")) - 1
    out.append("create: +1")
    await step("create again", kv.create("k", b"b"))
    await step("update at a wrong revision", kv.update("k", b"b", last=base + 7))
    await step("update", kv.update("k", b"b", last=base + 1))
    await step("delete at a wrong revision", kv.delete("k", last=base + 1))
    await step("get", kv.get("k"))
    await step("delete", kv.delete("k", last=base + 2))
    await step("get deleted", kv.get("k"))
    await step("update deleted at 0", kv.update("k", b"c", last=0))
    await step("create over the marker", kv.create("k", b"c"))
    await step("update absent at 0", kv.update("other", b"x", last=0))
    await step("delete absent at a revision", kv.delete("never", last=base + 1))
    return out


async def test_the_fake_kv_keeps_compare_and_set_like_jetstream(nats_url):
    nc = await nats.connect(nats_url)
    try:
        real = await _kv_script(await nc.jetstream().create_key_value(bucket="fake_check", history=1))
    finally:
        await nc.close()
    fake = await _kv_script(FakeKV())
    assert fake == real
    assert "delete at a wrong revision: BadRequestError 10071" in fake  # the delete that used to succeed


# ------------------------------------------------------------------------------- the rules


def test_pure_rules():
    assert lease_valid(10.0, 10.0 + 0.74 * 4, 4.0) and not lease_valid(10.0, 10.0 + 0.76 * 4, 4.0)
    assert not lease_valid(None, 0.0, 4.0)
    assert renewal_allowed(5.0, 6.0, 2.0) and not renewal_allowed(5.0, 7.5, 2.0) and not renewal_allowed(None, 0, 2)
    assert leader_stuck(1.0, 12.0, 10.0) and not leader_stuck(1.0, 10.0, 10.0)


TTL, POLL, STALL = 6.0, 0.5, 3.0


def _elections(clock: FakeClock, kv: FakeKV, *holders: str, stall_s: float = STALL) -> list[LeaseElection]:
    return [LeaseElection(kv, h, ttl_s=TTL, poll_s=POLL, stall_s=stall_s, clock=clock) for h in holders]


async def _run_for(clock: FakeClock, seconds: float, step: float = 0.25, beating=()) -> None:
    """Let ``seconds`` of fake time pass; the loops of ``beating`` show progress every step."""
    for _ in range(round(seconds / step)):
        for e in beating:
            e.beat()
        await clock.advance(step)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


async def test_a_leader_whose_loop_beats_keeps_the_lease(clock):
    kv = FakeKV(clock, TTL)
    (e,) = _elections(clock, kv, "a")
    e.start()
    try:
        await clock.advance(0)
        assert e.elected.is_set() and e.token == 1
        await _run_for(clock, 2 * TTL, beating=[e])  # renewed every TTL/3, so the key never expires
        assert e.is_leader and kv.holder() == "a" and kv.messages[names.LEADER_KEY].revision == 1 + 6
    finally:
        await e.close()
    assert kv.holder() is None and kv.deletes == 1  # a graceful stop releases the lease at once


async def test_a_leader_whose_loop_stalls_releases_the_lease_for_a_standby(clock):
    kv = FakeKV(clock, TTL)
    a, b = _elections(clock, kv, "a", "b")
    a.start()
    await clock.advance(0)
    b.start()
    try:
        # a's loop never beats (wedged); b's does. a renews at TTL/3 while its last beat is at most
        # STALL old, then releases; b, polling, takes over within stall + TTL/3 + poll.
        await _run_for(clock, STALL, beating=[b])
        assert kv.holder() == "a" and kv.deletes == 0
        await _run_for(clock, TTL / 3 + POLL, beating=[b])
        assert kv.deletes == 1 and a.token is None and a.lost.is_set()
        assert b.elected.is_set() and kv.holder() == "b" and not a.is_leader
        # a does not campaign again at once: it leaves the next term (a TTL) to b, which keeps it.
        await _run_for(clock, 2 * TTL, beating=[b])
        assert kv.holder() == "b" and b.is_leader and a.token is None
    finally:
        await a.close()
        await b.close()


async def test_a_dead_holder_is_replaced_once_the_bucket_ttl_ends_its_lease(clock):
    kv = FakeKV(clock, TTL)
    a, b = _elections(clock, kv, "a", "b")
    task = a.start()
    await clock.advance(0)
    b.start()
    try:
        await _run_for(clock, 1.0, beating=[a, b])
        task.cancel()  # kill -9: no release, the key stays until the bucket's TTL ends it
        await _run_for(clock, TTL - 1.0 - POLL, beating=[b])
        assert not b.elected.is_set() and kv.holder() == "a"
        await _run_for(clock, 2 * POLL, beating=[b])
        assert b.elected.is_set() and kv.holder() == "b" and b.token > a.token
    finally:
        await a.close()  # believes it holds the lease: its release at its old revision is refused
        await b.close()


async def test_a_renewal_whose_reply_was_lost_is_not_taken_for_a_lost_lease(clock):
    kv = FakeKV(clock, TTL)
    (e,) = _elections(clock, kv, "a")
    e.start()
    try:
        await clock.advance(0)
        token = e.token
        kv.lose_next_reply = True  # applied, but we hear a timeout: our revision is now stale
        for _ in range(8):  # the next renewal is refused for the stale revision, then recovers
            await _run_for(clock, 1.0, beating=[e])
            assert e.token == token, "stepped down although nobody else took the lease"
        assert e.is_leader and not e.lost.is_set() and not kv.lose_next_reply
    finally:
        await e.close()
    assert kv.holder() is None  # released at the revision it learnt by reading the key back


async def test_a_renewal_refused_because_another_holds_the_lease_steps_down(clock):
    kv = FakeKV(clock, TTL)
    (e,) = _elections(clock, kv, "a")
    e.start()
    try:
        await clock.advance(0)
        kv.lose_next_reply = True
        await _run_for(clock, TTL / 3 + 0.5, beating=[e])  # one renewal with a lost reply
        # Meanwhile the key expired and b took it: a's value is gone.
        kv.expire_now(names.LEADER_KEY)
        await kv.create(names.LEADER_KEY, encode(LeaderLease(holder="b", since=clock.time())))
        await _run_for(clock, TTL / 3, beating=[e])
        assert e.lost.is_set() and e.token is None and not e.is_leader
    finally:
        await e.close()
    assert kv.holder() == "b" and kv.deletes == 0  # b's lease is not released by a


async def test_a_stalled_holder_whose_lease_was_taken_meanwhile_deletes_nothing(clock):
    """A frozen holder thaws with a stale revision and a stale beat: its release is refused by the
    server (delete at a revision), so the standby that took over keeps the lease."""
    kv = FakeKV(clock, TTL)
    (a,) = _elections(clock, kv, "a")
    a.start()
    try:
        await clock.advance(0)
        await _run_for(clock, STALL)  # a never beats; its renewal at TTL/3 is still allowed
        assert a.is_leader and kv.messages[names.LEADER_KEY].revision == 2
        kv.expire_now(names.LEADER_KEY)
        await kv.create(names.LEADER_KEY, encode(LeaderLease(holder="b", since=clock.time())))
        await _run_for(clock, TTL / 3)  # the next renewal finds the beat too old: release
        assert a.lost.is_set() and a.token is None
        assert kv.holder() == "b" and kv.deletes == 0
    finally:
        await a.close()
    assert kv.holder() == "b"


async def test_closing_a_holder_whose_lease_was_taken_leaves_the_new_lease(clock):
    kv = FakeKV(clock, TTL)
    (a,) = _elections(clock, kv, "a")
    a.start()
    await clock.advance(0)
    kv.expire_now(names.LEADER_KEY)
    await kv.create(names.LEADER_KEY, encode(LeaderLease(holder="b", since=clock.time())))
    await a.close()  # a still believes it holds the lease: it deletes at its own revision
    assert kv.holder() == "b" and a.token is None


# ------------------------------------------------------------- the leader's writes at a revision


async def test_an_assignment_key_deleted_before_is_written_at_its_marker():
    """A purged key (`hfai local up` forgets the nodes of an earlier, larger cluster; one may come
    back) keeps a revision, its marker's: the leader's compare-and-set must name it, or that node
    never gets work again."""
    from fakes import FakeElection

    from hfai.controller.leader import Leader
    from hfai.core.config import Config
    from hfai.kv import KVCache
    from hfai.protocol.types import JobRecord, NodeAssignment

    assign, jobs = FakeKV(), FakeKV()
    await assign.put("n0", encode(NodeAssignment(node="n0", fence=3)))
    await assign.purge("n0")
    leader = Leader(Config(), None, jobs, assign, KVCache(jobs, JobRecord), None, FakeElection(token=7),
                    asyncio.Event())
    await leader._load_assignments()  # keys() does not list a purged key
    await leader._write_assignment("n0", NodeAssignment(node="n0", fence=7))
    assert decode((await assign.get("n0")).value, NodeAssignment).fence == 7
