"""Leader election through a lease key in the KV bucket ``hfai_leader``.

Acquire with create-if-absent; renew every ttl/3 with update-at-revision; the bucket's TTL ends a
lease whose holder died. The revision at acquisition is the *fencing token*: it only grows across
leaders, every assignment carries it, and agents ignore assignments with an older one.
A holder that could not renew for ``ttl * SAFETY`` stops acting as leader before the key can
expire, so two leaders never act at once.
"""

from __future__ import annotations

import asyncio
import logging
import time

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from hfai.protocol import encode, names
from hfai.protocol.types import LeaderLease

log = logging.getLogger(__name__)

SAFETY = 0.75


def lease_valid(last_renewed: float | None, now: float, ttl: float) -> bool:
    """Pure: may a holder whose last successful write was at ``last_renewed`` still act?"""
    return last_renewed is not None and now - last_renewed < ttl * SAFETY


class LeaseElection:
    def __init__(self, kv: KeyValue, holder: str, ttl_s: float, poll_s: float):
        self._kv = kv
        self.holder = holder
        self.ttl_s = ttl_s
        self.poll_s = poll_s
        self.token: int | None = None
        self._revision: int | None = None
        self._last_renewed: float | None = None
        self.elected = asyncio.Event()
        self.lost = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def is_leader(self) -> bool:
        return self.token is not None and lease_valid(self._last_renewed, time.monotonic(), self.ttl_s)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="lease")

    async def _run(self) -> None:
        while True:
            if self.token is None:
                await self._try_acquire()
                await asyncio.sleep(self.poll_s if self.token is None else self.ttl_s / 3)
            else:
                await self._renew()
                await asyncio.sleep(self.ttl_s / 3)

    async def _try_acquire(self) -> None:
        value = encode(LeaderLease(holder=self.holder, since=time.time()))
        try:
            rev = await self._kv.create(names.LEADER_KEY, value)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.errors.Error, asyncio.TimeoutError):
            return
        self.token = self._revision = rev
        self._last_renewed = time.monotonic()
        self.lost.clear()
        self.elected.set()
        log.info("%s is leader (fencing token %d)", self.holder, rev)

    async def _renew(self) -> None:
        value = encode(LeaderLease(holder=self.holder, since=time.time()))
        try:
            self._revision = await self._kv.update(names.LEADER_KEY, value, last=self._revision)
            self._last_renewed = time.monotonic()
            return
        except nats.js.errors.KeyWrongLastSequenceError:
            log.warning("%s lost the lease to another controller", self.holder)
            self._step_down()
        except (nats.errors.Error, asyncio.TimeoutError) as e:
            # Keep trying until the lease would be invalid; then act no more.
            if not lease_valid(self._last_renewed, time.monotonic(), self.ttl_s):
                log.warning("%s could not renew the lease (%s); stepping down", self.holder, e)
                self._step_down()

    def _step_down(self) -> None:
        self.token = self._revision = self._last_renewed = None
        self.elected.clear()
        self.lost.set()

    async def close(self) -> None:
        """Stop campaigning; a holder releases the lease at once so a standby takes over quickly."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.token is not None:
            try:
                await self._kv.delete(names.LEADER_KEY, last=self._revision)
            except Exception as e:  # best effort: the TTL ends the lease anyway
                log.debug("lease release failed: %s", e)
            self._step_down()
