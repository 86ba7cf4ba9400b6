"""Stand-ins the unit tests share for what a daemon gets from NATS: a KV bucket with JetStream's
compare-and-set (test_leader_election checks it against a real bucket), an election that always
holds the lease, and a message as a subscription hands it over."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from hfai.core.clock import FakeClock
from hfai.protocol import decode, encode, names
from hfai.protocol.types import LeaderLease

#: JetStream's error code for "wrong last sequence" (nats-py's delete raises it as a BadRequestError).
WRONG_LAST_SEQUENCE = 10071


@dataclass
class _Message:
    value: bytes
    revision: int
    op: str | None  # None: a value; "DEL" / "PURGE": a marker
    written: float


class FakeKV:
    """One KV bucket as nats-py's ``KeyValue`` presents it, compare-and-set included.

    Every write takes the bucket's next revision (its stream sequence). ``update(last=)`` and
    ``delete(last=)`` are refused unless ``last`` is the revision of the key's latest message (a
    delete marker counts; a key never written, or expired: 0); ``update`` raises
    KeyWrongLastSequenceError, ``delete`` the BadRequestError (an APIError) that nats-py passes
    through. ``get`` of a deleted key raises KeyNotFoundError carrying the marker. With ``clock`` and ``ttl_s`` a
    message older than the bucket's TTL is gone, as in a bucket with a max age.

    ``lose_next_reply``: the next update is applied but its caller gets a timeout, as when the
    reply is lost or arrives after the request timed out on an overloaded host."""

    def __init__(self, clock: FakeClock | None = None, ttl_s: float | None = None):
        self.clock = clock
        self.ttl_s = ttl_s
        self.messages: dict[str, _Message] = {}
        self.seq = 0
        self.lose_next_reply = False
        self.deletes = 0

    def _expire(self) -> None:
        if self.clock is None or self.ttl_s is None:
            return
        now = self.clock.monotonic()
        for key in [k for k, m in self.messages.items() if now - m.written >= self.ttl_s]:
            del self.messages[key]

    def _last(self, key: str) -> int:
        self._expire()
        m = self.messages.get(key)
        return m.revision if m is not None else 0

    def _put(self, key: str, value: bytes, op: str | None = None) -> int:
        self.seq += 1
        self.messages[key] = _Message(value, self.seq, op, self.clock.monotonic() if self.clock else 0.0)
        return self.seq

    async def put(self, key: str, value: bytes) -> int:
        return self._put(key, value)

    async def create(self, key: str, value: bytes) -> int:
        self._expire()
        m = self.messages.get(key)
        if m is not None and m.op is None:
            raise nats.js.errors.KeyWrongLastSequenceError(f"wrong last sequence: {m.revision}")
        return self._put(key, value)  # nats-py writes over a delete marker at its revision

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        held = self._last(key)
        if held != (last or 0):
            raise nats.js.errors.KeyWrongLastSequenceError(f"wrong last sequence: {held}")
        rev = self._put(key, value)
        if self.lose_next_reply:
            self.lose_next_reply = False
            raise nats.errors.TimeoutError
        return rev

    async def get(self, key: str) -> KeyValue.Entry:
        self._expire()
        m = self.messages.get(key)
        if m is None:
            raise nats.js.errors.KeyNotFoundError
        entry = KeyValue.Entry(bucket="fake", key=key, value=m.value, revision=m.revision, delta=None,
                               created=None, operation=None)
        if m.op is not None:
            raise nats.js.errors.KeyNotFoundError(entry, m.op)
        return entry

    async def delete(self, key: str, last: int | None = None) -> bool:
        held = self._last(key)
        if last and last > 0 and held != last:
            raise nats.js.errors.BadRequestError(code=400, err_code=WRONG_LAST_SEQUENCE,
                                                 description=f"wrong last sequence: {held}")
        self._put(key, b"", "DEL")
        self.deletes += 1
        return True

    async def purge(self, key: str) -> bool:
        self._put(key, b"", "PURGE")
        return True

    async def keys(self) -> list[str]:
        self._expire()
        live = [k for k, m in self.messages.items() if m.op is None]
        if not live:
            raise nats.js.errors.NoKeysError
        return live

    def expire_now(self, key: str) -> None:
        """The key's message reached the bucket's TTL."""
        self.messages.pop(key, None)

    def holder(self) -> str | None:
        m = self.messages.get(names.LEADER_KEY)
        return decode(m.value, LeaderLease).holder if m is not None and m.op is None else None


class FakeElection:
    """An election this replica has won for good: the leader's writes carry ``token``."""

    def __init__(self, token: int = 7):
        self.token = token
        self.is_leader = True

    def beat(self) -> None:
        pass


class FakeMsg:
    """A message as a subscription hands it over: ``subject`` and ``payload`` encoded as its data.
    ``ack()`` marks it acked (a JetStream consumer's message); ``respond(data)`` puts the reply on
    ``replies`` (a request's)."""

    def __init__(self, subject: str, payload, replies: asyncio.Queue | None = None):
        self.subject, self.data, self.reply = subject, encode(payload), "_INBOX.x"
        self.acked = False
        self._replies = replies

    async def ack(self) -> None:
        self.acked = True

    async def respond(self, data: bytes) -> None:
        assert self._replies is not None, "a request's message needs a replies queue"
        await self._replies.put(data)
