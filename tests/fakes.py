"""Stand-ins the unit tests share for what a daemon gets from NATS: an election that always holds
the lease, and a message as a subscription hands it over."""

from __future__ import annotations

import asyncio

from hfai.protocol import encode


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
