"""Lease election: renewal gated on the leader loop's progress, and a renewal whose reply was
lost is not mistaken for losing the lease (issue 11). Against an in-memory KV with the same
compare-and-set semantics as a JetStream bucket; the live failovers are in test_fault_leader.py."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import nats.errors
import nats.js.errors

from hfai.controller.election import LeaseElection, lease_valid, renewal_allowed
from hfai.controller.service import leader_stuck
from hfai.protocol import decode, names
from hfai.protocol.types import LeaderLease


@dataclass
class Entry:
    key: str
    value: bytes
    revision: int


class FakeKV:
    """create / update(last=) / get / delete(last=) of one KV bucket, with a revision counter.
    ``lose_next_reply``: the next update is applied but its caller gets a timeout, as when the
    reply is lost or arrives after the request timed out on an overloaded host."""

    def __init__(self):
        self.entries: dict[str, Entry] = {}
        self.seq = 0
        self.lose_next_reply = False
        self.deletes = 0

    def _put(self, key, value) -> int:
        self.seq += 1
        self.entries[key] = Entry(key, value, self.seq)
        return self.seq

    async def create(self, key, value):
        if key in self.entries:
            raise nats.js.errors.KeyWrongLastSequenceError("wrong last sequence")
        return self._put(key, value)

    async def update(self, key, value, last=None):
        if key not in self.entries or self.entries[key].revision != last:
            raise nats.js.errors.KeyWrongLastSequenceError("wrong last sequence")
        rev = self._put(key, value)
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise nats.errors.TimeoutError
        return rev

    async def get(self, key):
        if key not in self.entries:
            raise nats.js.errors.KeyNotFoundError
        return self.entries[key]

    async def delete(self, key, last=None):
        if key in self.entries and (last is None or self.entries[key].revision == last):
            del self.entries[key]
            self.deletes += 1

    def holder(self) -> str | None:
        e = self.entries.get(names.LEADER_KEY)
        return decode(e.value, LeaderLease).holder if e else None


def test_pure_rules():
    assert lease_valid(10.0, 10.0 + 0.74 * 4, 4.0) and not lease_valid(10.0, 10.0 + 0.76 * 4, 4.0)
    assert not lease_valid(None, 0.0, 4.0)
    assert renewal_allowed(5.0, 6.0, 2.0) and not renewal_allowed(5.0, 7.5, 2.0) and not renewal_allowed(None, 0, 2)
    assert leader_stuck(1.0, 12.0, 10.0) and not leader_stuck(1.0, 10.0, 10.0)


async def test_a_leader_whose_loop_beats_keeps_the_lease():
    kv = FakeKV()
    e = LeaseElection(kv, "a", ttl_s=0.6, poll_s=0.05, stall_s=0.3)
    e.start()
    try:
        await asyncio.wait_for(e.elected.wait(), 2)
        for _ in range(12):  # 1.2 s: two TTLs
            e.beat()
            await asyncio.sleep(0.1)
        assert e.is_leader and kv.holder() == "a" and kv.entries[names.LEADER_KEY].revision > e.token
    finally:
        await e.close()
    assert kv.holder() is None  # a graceful stop releases the lease


async def test_a_leader_whose_loop_stalls_releases_the_lease_for_a_standby():
    kv = FakeKV()
    a = LeaseElection(kv, "a", ttl_s=0.6, poll_s=0.05, stall_s=0.3)
    b = LeaseElection(kv, "b", ttl_s=0.6, poll_s=0.05, stall_s=0.3)
    a.start()
    await asyncio.wait_for(a.elected.wait(), 2)
    b.start()
    try:
        # a's loop never beats (wedged); b's does. b must get the lease within stall + ttl/3 + poll.
        t0 = time.monotonic()
        while not b.elected.is_set():
            b.beat()
            await asyncio.sleep(0.02)
            assert time.monotonic() - t0 < 0.3 + 0.2 + 0.5, "the stalled holder kept the lease"
        assert kv.deletes == 1 and not a.is_leader and a.lost.is_set() and kv.holder() == "b"
        # a does not campaign again at once: it leaves the next term to b.
        for _ in range(10):
            b.beat()
            await asyncio.sleep(0.05)
        assert kv.holder() == "b" and b.is_leader and a.token is None
    finally:
        await a.close()
        await b.close()


async def test_a_renewal_whose_reply_was_lost_is_not_taken_for_a_lost_lease():
    kv = FakeKV()
    e = LeaseElection(kv, "a", ttl_s=0.9, poll_s=0.05)
    e.start()
    try:
        await asyncio.wait_for(e.elected.wait(), 2)
        token = e.token
        kv.lose_next_reply = True  # applied, but we hear a timeout: our revision is now stale
        for _ in range(12):  # the next renewal is refused for the stale revision, then recovers
            await asyncio.sleep(0.1)
            assert e.token == token, "stepped down although nobody else took the lease"
        assert e.is_leader and not e.lost.is_set() and not kv.lose_next_reply
    finally:
        await e.close()


async def test_a_renewal_refused_because_another_holds_the_lease_steps_down():
    kv = FakeKV()
    e = LeaseElection(kv, "a", ttl_s=0.6, poll_s=0.05)
    e.start()
    try:
        await asyncio.wait_for(e.elected.wait(), 2)
        kv.lose_next_reply = True
        await asyncio.sleep(0.25)  # one renewal with a lost reply
        # Meanwhile the key expired and b took it: a's value is gone.
        del kv.entries[names.LEADER_KEY]
        await kv.create(names.LEADER_KEY, b"b's lease")
        await asyncio.wait_for(e.lost.wait(), 2)
        assert e.token is None and not e.is_leader
    finally:
        await e.close()
    assert names.LEADER_KEY in kv.entries  # b's lease is not released by a
