"""Leader election through a lease key in the KV bucket ``hfai_leader``.

Acquire with create-if-absent; renew every ttl/3 with update-at-revision; the bucket's TTL ends a
lease whose holder died. The revision at acquisition is the *fencing token*: it only grows across
leaders, every assignment carries it, and agents ignore assignments with an older one.
A holder that could not renew for ``ttl * SAFETY`` stops acting as leader before the key can
expire, so two leaders never act at once.

Holding the lease is not enough: the lease is renewed only while the leader loop shows progress
(:meth:`LeaseElection.beat`, at least every ``stall_s``). A holder whose loop is stuck releases
the lease, so a standby takes over, instead of renewing it for ever while scheduling nothing
(a wedged leader would keep every job queued for minutes).
"""

from __future__ import annotations

import asyncio
import logging
import math

import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from hfai.core.clock import SYSTEM, Clock
from hfai.core.daemon import CANCEL_TIMEOUT_S, cancel_and_wait, raise_if_cancelled
from hfai.protocol import decode, encode, names
from hfai.protocol.types import LeaderLease

log = logging.getLogger(__name__)

SAFETY = 0.75


def lease_valid(last_renewed: float | None, now: float, ttl: float) -> bool:
    """Pure: may a holder whose last successful write was at ``last_renewed`` still act?"""
    return last_renewed is not None and now - last_renewed < ttl * SAFETY


def renewal_allowed(last_beat: float | None, now: float, stall_s: float) -> bool:
    """Pure: may a holder whose leader loop last showed progress at ``last_beat`` renew?"""
    return last_beat is not None and now - last_beat <= stall_s


class LeaseElection:
    """One replica's campaign for the lease. Every reading of the time and every pause goes
    through ``clock``, so the timing rules are tested on a :class:`hfai.core.clock.FakeClock`."""

    def __init__(self, kv: KeyValue, holder: str, ttl_s: float, poll_s: float, stall_s: float = math.inf,
                 clock: Clock = SYSTEM):
        self._kv = kv
        self._clock = clock
        self.holder = holder
        self.ttl_s = ttl_s
        self.poll_s = poll_s
        self.stall_s = stall_s
        self.token: int | None = None
        self._revision: int | None = None
        self._last_renewed: float | None = None
        self._last_beat: float | None = None
        # A renewal whose reply never came (value, when sent): it may have been applied.
        self._unconfirmed: tuple[bytes, float] | None = None
        # After giving the lease up for a stuck loop, leave the next term to a standby.
        self._campaign_after = 0.0
        self.elected = asyncio.Event()
        self.lost = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def is_leader(self) -> bool:
        return self.token is not None and lease_valid(self._last_renewed, self._clock.monotonic(), self.ttl_s)

    def beat(self) -> None:
        """The leader loop made progress: the lease may be renewed for another ``stall_s``."""
        self._last_beat = self._clock.monotonic()

    def start(self) -> asyncio.Task:
        """Campaign (and renew) in a task of its own, which is returned."""
        self._task = asyncio.create_task(self._run(), name="lease")
        return self._task

    async def _run(self) -> None:
        while True:
            raise_if_cancelled()  # an await in nats-py may have swallowed a cancellation
            try:
                if self.token is None:
                    if self._clock.monotonic() >= self._campaign_after:
                        await self._try_acquire()
                else:
                    await self._renew()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let one odd error end campaigning for good
                log.exception("%s: lease round failed", self.holder)
            await self._clock.sleep(self.poll_s if self.token is None else self.ttl_s / 3)

    async def _try_acquire(self) -> None:
        value = encode(LeaderLease(holder=self.holder, since=self._clock.time()))
        sent = self._clock.monotonic()
        try:
            rev = await self._kv.create(names.LEADER_KEY, value)
        except (TimeoutError, nats.js.errors.KeyWrongLastSequenceError, nats.errors.Error):
            return
        self.token = self._revision = rev
        # Counted from before the write: the key's TTL cannot have started earlier.
        self._last_renewed = sent
        self._last_beat = self._clock.monotonic()  # the new leader loop gets stall_s to show progress
        self._unconfirmed = None
        self.lost.clear()
        self.elected.set()
        log.info("%s is leader (fencing token %d)", self.holder, rev)

    async def _renew(self) -> None:
        now = self._clock.monotonic()
        if not renewal_allowed(self._last_beat, now, self.stall_s):
            log.warning("%s: the leader loop made no progress for %.1fs; releasing the lease for a standby",
                        self.holder, now - (self._last_beat or now))
            self._campaign_after = now + self.ttl_s
            await self._release()
            return
        value = encode(LeaderLease(holder=self.holder, since=self._clock.time()))
        sent = self._clock.monotonic()
        try:
            self._revision = await self._kv.update(names.LEADER_KEY, value, last=self._revision)
            self._last_renewed = sent
            self._unconfirmed = None
            return
        except nats.js.errors.KeyWrongLastSequenceError:
            if await self._unconfirmed_renewal_landed():
                return
            self._step_down()
        except (TimeoutError, nats.errors.Error) as e:
            self._unconfirmed = (value, sent)
            # Keep trying until the lease would be invalid; then act no more.
            if not lease_valid(self._last_renewed, self._clock.monotonic(), self.ttl_s):
                log.warning("%s could not renew the lease (%s); stepping down", self.holder, e)
                self._step_down()

    async def _unconfirmed_renewal_landed(self) -> bool:
        """After a renewal was refused for a stale revision: was it our own earlier renewal, whose
        reply was lost (a timeout under load), that moved the revision? Then keep the lease.
        Under CPU overload this, not another controller, was what "lost" the lease."""
        try:
            entry = await self._kv.get(names.LEADER_KEY)
        except (TimeoutError, nats.js.errors.KeyNotFoundError, nats.errors.Error):
            entry = None
        if entry is not None and self._unconfirmed is not None and entry.value == self._unconfirmed[0]:
            self._revision, self._last_renewed = entry.revision, self._unconfirmed[1]
            self._unconfirmed = None
            log.info("%s: a renewal whose reply was lost had been applied; still leader", self.holder)
            return True
        holder = "nobody"
        if entry is not None and entry.value:
            try:
                holder = decode(entry.value, LeaderLease).holder
            except Exception:
                holder = "an unreadable holder"
        log.warning("%s lost the lease (now held by %s)", self.holder, holder)
        return False

    def _step_down(self) -> None:
        self.token = self._revision = self._last_renewed = None
        self._unconfirmed = None
        self.elected.clear()
        self.lost.set()

    async def _release(self) -> None:
        """Delete our lease key (only if still ours) and step down: a standby takes over at once."""
        try:
            await self._kv.delete(names.LEADER_KEY, last=self._revision)
        except Exception as e:  # best effort: the TTL ends the lease anyway
            log.debug("lease release failed: %s", e)
        self._step_down()

    async def close(self, timeout_s: float | None = CANCEL_TIMEOUT_S) -> None:
        """Stop campaigning; a holder releases the lease at once so a standby takes over quickly."""
        try:
            if self._task is not None:
                await cancel_and_wait([self._task], timeout_s)
        finally:
            if self.token is not None:
                await self._release()
