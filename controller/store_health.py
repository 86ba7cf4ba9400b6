"""Is the NATS store taking writes? A probe write, repeated, judged by a small pure state machine.

nats-server keeps a stream broken after a write error on its store (a full disk: "Critical write
error"): its puts get no answer, even once the disk has room again, until the server restarts.
Every daemon stays connected and nothing else fails loudly, so the controller
probes: every ``store_probe_s`` it writes a value of its own to the ``hfai_health`` bucket, a file
stream like the jobs' and nodes', and calls the store not writable after ``store_probe_failures``
failed writes in a row. A probe stream that met the error stays broken as the others do, so the
alarm holds until the server is restarted (the local cluster's supervisor does that once the disk
has room; in production an operator does, told by `hfai nodes` and the metrics).

The probe value is :data:`PROBE_BYTES` long: a write of a few bytes can land in a file page
already allocated and succeed on a full disk, one of a page or more cannot.

A failed write is a store fault only if the server's JetStream answers otherwise: a server cut off
from its cluster (a partition), or down, fails every write too. So each failed write is followed
by an account-info request (hfai.core.cutoff.check); unanswered, the probe is counted as *unreachable*:
it neither raises nor clears the alarm, and is logged as what it is (the connection moves to
another server by itself, hfai.core.cutoff).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import KeyValueConfig, StorageType
from nats.js.kv import KeyValue

from hfai.core import cutoff as _cutoff
from hfai.core.daemon import repeat
from hfai.protocol import names
from hfai.protocol.types import StoreHealth

log = logging.getLogger(__name__)

PROBE_BYTES = 4096
DETAIL_CHARS = 200
# Probe values expire: a controller's key is named after its id (host and pid by default), so
# every restart adds one, and nothing else would ever delete them.
PROBE_TTL_S = 3600.0


@dataclass
class StoreWatch:
    """Pure: the store's health from the outcomes of probe writes, in order.

    Writable -> not writable after ``failures_to_alarm`` failures in a row; back at the first
    success. ``since`` is the wall time the current run (of failures, or of successes) began."""

    failures_to_alarm: int
    failures: int = 0
    since: float = 0.0
    detail: str = ""
    checked: float = 0.0

    unreachable: int = 0  # probes in a row that found no JetStream to ask (not counted as failures)

    def observe(self, ok: bool, now: float, detail: str = "", reachable: bool = True) -> bool:
        """Take one probe's outcome; returns True when this changed whether the store is writable.
        A failure with ``reachable`` False (JetStream answered nothing: the server is cut off or
        down) says nothing of the store: it leaves the judgement as it is."""
        if not ok and not reachable:
            self.unreachable += 1
            self.checked = now
            return False
        self.unreachable = 0
        was = self.writable
        if ok:
            if self.failures or not self.checked:
                self.since = now
            self.failures, self.detail = 0, ""
        else:
            if not self.failures:
                self.since = now
            self.failures += 1
            self.detail = detail[:DETAIL_CHARS]
        self.checked = now
        return was != self.writable

    @property
    def writable(self) -> bool:
        return self.failures < max(1, self.failures_to_alarm)

    @property
    def health(self) -> StoreHealth:
        return StoreHealth(writable=self.writable, since=self.since, failures=self.failures, detail=self.detail,
                           checked=self.checked)


async def health_bucket(js: JetStreamContext, replicas: int) -> KeyValue:
    """The ``hfai_health`` bucket (made if missing): one value per prober, no history, on file."""
    try:
        return await js.key_value(names.BUCKET_HEALTH)
    except nats.js.errors.BucketNotFoundError:
        return await js.create_key_value(KeyValueConfig(bucket=names.BUCKET_HEALTH, history=1, replicas=replicas,
                                                        storage=StorageType.FILE, ttl=PROBE_TTL_S))


@dataclass(frozen=True)
class Probe:
    """One probe's outcome: ``failure`` "" (the write was taken) or what failed; ``reachable``
    False when JetStream answered nothing at all (the server cut off from its cluster, or down)."""

    failure: str = ""
    reachable: bool = True


async def probe_once(js: JetStreamContext, key: str, replicas: int, timeout_s: float) -> Probe:
    """One probe write of ``key`` given ``timeout_s``, and when it fails, whether JetStream answers
    anything (an account-info request, also given ``timeout_s``)."""
    names.check_token("probe key", key)
    sent = time.monotonic()
    try:
        kv = await asyncio.wait_for(health_bucket(js, replicas), timeout_s)
        sent = time.monotonic()
        await asyncio.wait_for(kv.put(key, os.urandom(PROBE_BYTES)), timeout_s)
        return Probe()
    except (TimeoutError, nats.errors.TimeoutError):
        failure = f"a {PROBE_BYTES}-byte write to {names.BUCKET_HEALTH} got no answer within {timeout_s:g}s"
    except nats.errors.Error as e:
        failure = f"a write to {names.BUCKET_HEALTH} failed: {type(e).__name__}: {e}"
    # The bucket's leader heard from no quorum of its replicas while the write waited: the cluster
    # is out of touch (a store fault would leave the replicas talking, and nats-server's leaders
    # hear from theirs every second or so: a probe given under a second cannot tell).
    silent = await _cutoff.check(js, timeout_s, f"KV_{names.BUCKET_HEALTH}", time.monotonic() - sent)
    if silent:
        return Probe(f"{failure}; {silent}: the NATS server is cut off from its cluster, or down", reachable=False)
    return Probe(failure)


class StoreProbe:
    """Probes the store every ``every_s`` on ``js`` as ``key`` until cancelled; :attr:`health`
    is the latest judgement (a writable store until the first probe says otherwise)."""

    def __init__(self, js: JetStreamContext, key: str, replicas: int, every_s: float, timeout_s: float,
                 failures_to_alarm: int):
        self._js, self.key, self._replicas = js, key, replicas
        self.every_s, self.timeout_s = every_s, timeout_s
        self.watch = StoreWatch(failures_to_alarm)

    @property
    def health(self) -> StoreHealth:
        return self.watch.health

    async def check(self) -> StoreHealth:
        probe = await probe_once(self._js, self.key, self._replicas, self.timeout_s)
        failure = probe.failure
        if not probe.reachable:
            self.watch.observe(False, time.time(), failure, reachable=False)
            # Not the store's fault: the connection moves to a server that answers (hfai.core.cutoff).
            log.warning("store probe: no JetStream to ask (%d probes in a row): %s", self.watch.unreachable, failure)
            return self.health
        if self.watch.observe(not failure, time.time(), failure):
            if failure:
                log.critical("the NATS store refuses writes (%d probes failed in a row, the last: %s); "
                             "nats-server keeps a store broken after a write error: free space on its disk "
                             "and restart it", self.watch.failures, failure)
            else:
                log.warning("the NATS store takes writes again")
        elif failure:
            log.warning("store probe failed (%d in a row): %s", self.watch.failures, failure)
        return self.health

    async def run(self) -> None:
        """Probe until cancelled; never ends on its own (a daemon's supervised task)."""
        await repeat(self.check, self.every_s, "store probe")
