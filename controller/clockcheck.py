"""Does this controller's wall clock agree with the NATS server's? A measurement, repeated, judged
by a small pure state machine.

Job records carry wall stamps (``submit_ts``, ``ended_ts``) that the leader compares with its own
clock to forget finished jobs after ``finished_retention_s``. A leader whose clock ran 31 days
ahead would purge the record of a job that had just finished. Hosts' clocks cannot be
assumed right, but the NATS server stamps every message it stores, and every replica reaches it:
so every ``clock_check_s`` a replica writes a value to the ``hfai_health`` bucket, reads back the
server's stamp of that very write (the ``Nats-Time-Stamp`` of the stored message), and takes
``offset = (sent + answered) / 2 - stamp``, within half the round trip.

An offset beyond ``clock_skew_alarm_s`` raises the alarm (an error in the log, the metric
``hfai_controller_clock_skewed``). The leader then forgets no finished job, nor while its clock is
unchecked; otherwise it judges their age on the server's clock (its own, less the offset).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import nats.errors
from nats.js import JetStreamContext
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from hfai.controller.store_health import health_bucket
from hfai.core.daemon import repeat
from hfai.protocol import names

log = logging.getLogger(__name__)

# How many check periods a measurement is relied on for: one failed check does not stop retention.
FRESH_CHECKS = 3


@dataclass
class ClockWatch:
    """Pure: the latest measurement of this host's wall clock against the NATS server's.

    ``offset_s``: this clock minus the server's (positive: ahead), within ``error_s``;
    ``measured``: the monotonic time of that measurement (None: none yet)."""

    alarm_s: float
    fresh_s: float
    offset_s: float = 0.0
    error_s: float = 0.0
    measured: float | None = None

    def observe(self, offset_s: float, error_s: float, mono: float) -> bool:
        """Take one measurement; True when it changed whether the clocks disagree."""
        was = self.skewed
        self.offset_s, self.error_s, self.measured = offset_s, error_s, mono
        return was != self.skewed

    @property
    def skewed(self) -> bool:
        """The clocks disagree by more than ``alarm_s``, however the round trip fell."""
        return self.measured is not None and abs(self.offset_s) - self.error_s > self.alarm_s

    def fresh(self, mono: float) -> bool:
        return self.measured is not None and mono - self.measured <= self.fresh_s

    def offset(self, mono: float) -> float | None:
        """The offset to correct this clock by (None while no measurement is fresh)."""
        return self.offset_s if self.fresh(mono) else None

    def server_now(self, wall: float, mono: float) -> float | None:
        """The NATS server's time at this host's ``wall``, for judging the age of records: None
        while this clock is unchecked, the check is stale, or the two disagree (the alarm)."""
        if not self.fresh(mono) or self.skewed:
            return None
        return wall - self.offset_s

    def describe(self) -> str:
        way = "ahead of" if self.offset_s > 0 else "behind"
        return f"{abs(self.offset_s):.1f}s {way} the NATS server's (within {self.error_s:.3f}s)"


async def measure(js: JetStreamContext, key: str, replicas: int, timeout_s: float,
                  wall: Callable[[], float] = time.time) -> tuple[float, float]:
    """(offset, error) of this host's wall clock against the server's, from one write of ``key``
    to the health bucket. Raises TimeoutError or nats.errors.Error."""
    names.check_token("clock check key", key)
    kv = await asyncio.wait_for(health_bucket(js, replicas), timeout_s)
    sent = wall()
    revision = await asyncio.wait_for(kv.put(key, b"clock"), timeout_s)
    answered = wall()
    stored = await asyncio.wait_for(js.get_msg(f"KV_{names.BUCKET_HEALTH}", seq=revision), timeout_s)
    if stored.time is None:
        raise nats.errors.Error("the server gave no time stamp for the stored message")
    return (sent + answered) / 2 - stored.time.timestamp(), (answered - sent) / 2


class ClockCheck:
    """Measures every ``every_s`` on ``js`` as ``key`` until cancelled; :attr:`watch` holds the
    judgement."""

    def __init__(self, js: JetStreamContext, key: str, replicas: int, every_s: float, timeout_s: float,
                 alarm_s: float):
        self._js, self.key, self._replicas = js, key, replicas
        self.every_s, self.timeout_s = every_s, timeout_s
        self.watch = ClockWatch(alarm_s, FRESH_CHECKS * every_s)

    async def check(self) -> None:
        try:
            offset, error = await measure(self._js, self.key, self._replicas, self.timeout_s)
        except (TimeoutError, nats.errors.Error) as e:
            log.warning("could not compare this host's clock with the NATS server's: %s", e or type(e).__name__)
            return
        if self.watch.observe(offset, error, time.monotonic()):
            if self.watch.skewed:
                log.error("this host's clock is %s, more than clock_skew_alarm_s=%gs: finished jobs are not "
                          "forgotten until it is set right (NTP)", self.watch.describe(), self.watch.alarm_s)
            else:
                log.warning("this host's clock agrees with the NATS server's again (%s)", self.watch.describe())

    async def run(self) -> None:
        """Check until cancelled; never ends on its own (a daemon's supervised task)."""
        await repeat(self.check, self.every_s, "clock check")


class ClockMetrics(Collector):
    """The check's gauges, read at scrape time."""

    def __init__(self, watch: ClockWatch):
        self._watch = watch

    def collect(self):
        w = self._watch
        skewed = GaugeMetricFamily("hfai_controller_clock_skewed", "1 while this replica's wall clock and the "
                                   "NATS server's disagree by more than clock_skew_alarm_s")
        skewed.add_metric([], 1 if w.skewed else 0)
        offset = GaugeMetricFamily("hfai_controller_clock_offset_seconds", "This replica's wall clock minus the "
                                   "NATS server's, as last measured (NaN: not yet)")
        offset.add_metric([], w.offset_s if w.measured is not None else float("nan"))
        return [skewed, offset]
