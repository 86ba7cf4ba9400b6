"""Prometheus metrics of a controller replica (``[controller] metrics_port``; 0: off).

Gauges are read from the replica's live copies when scraped; the latency histograms are fed by a
scan of the job records (:func:`latencies`, pure) while this replica leads, so a cluster of
replicas counts each job once; the scheduling round is timed by wrapping the leader's ``tick``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hfai.protocol.types import ChainState, JobRecord, NodeInfo, NodeState, StoreHealth

log = logging.getLogger(__name__)

# Seconds: scheduling rounds are milliseconds; waits for nodes minutes to days.
ROUND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
WAIT_BUCKETS = (1, 5, 15, 30, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600, 86400, 7 * 86400)
RELEASE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


def latencies(job: JobRecord) -> list[tuple[str, str, float]]:
    """(histogram, unique key, seconds) the record's history shows: submit -> first running, and
    each suspending -> suspended (asked to suspend -> nodes released)."""
    out: list[tuple[str, str, float]] = []
    first = next((e for e in job.history if e.state is ChainState.RUNNING), None)
    if first is not None and job.history and job.history[0].state is ChainState.QUEUED:
        out.append(("submit_to_running", job.id, max(0.0, first.ts - job.submit_ts)))
    asked: float | None = None
    for e in job.history:
        if e.state is ChainState.SUSPENDING:
            asked = e.ts
        elif e.state is ChainState.SUSPENDED and asked is not None:
            out.append(("suspend_to_released", f"{job.id}@{asked}", max(0.0, e.ts - asked)))
            asked = None
        elif e.state is not ChainState.SUSPENDING:
            asked = None
    return out


class _Live(Collector):
    """Jobs and nodes by state, read from the replica's caches at scrape time."""

    def __init__(self, jobs: Callable[[], Iterable[JobRecord]], nodes: Callable[[], Iterable[NodeInfo]],
                 reconnects: Callable[[], int], store: Callable[[], StoreHealth] | None = None):
        self._jobs, self._nodes, self._reconnects, self._store = jobs, nodes, reconnects, store

    def collect(self):
        jobs = GaugeMetricFamily("hfai_jobs", "Jobs known to the controller, by state", labels=["state"])
        counts = {s.value: 0 for s in ChainState}
        for j in self._jobs():
            counts[j.state.value] += 1
        for state, n in counts.items():
            jobs.add_metric([state], n)
        nodes = GaugeMetricFamily("hfai_nodes", "Nodes by state", labels=["state"])
        by_state = {s.value: 0 for s in NodeState}
        for info in self._nodes():
            by_state[info.state.value] += 1
        for state, n in by_state.items():
            nodes.add_metric([state], n)
        rc = CounterMetricFamily("hfai_nats_reconnects", "Reconnections of this process to NATS")
        rc.add_metric([], self._reconnects())
        return [jobs, nodes, rc, *self._store_metrics()]

    def _store_metrics(self) -> list:
        if self._store is None:
            return []
        health = self._store()
        writable = GaugeMetricFamily("hfai_nats_store_writable", "1 while the NATS store takes this replica's "
                                     "probe writes, 0 once store_probe_failures in a row failed")
        writable.add_metric([], 1 if health.writable else 0)
        failures = GaugeMetricFamily("hfai_nats_store_probe_failures", "Store probe writes failed in a row")
        failures.add_metric([], health.failures)
        return [writable, failures]


class ControllerMetrics:
    def __init__(self, jobs: Callable[[], Iterable[JobRecord]], nodes: Callable[[], Iterable[NodeInfo]],
                 reconnects: Callable[[], int], store: Callable[[], StoreHealth] | None = None):
        self.registry = r = CollectorRegistry()
        r.register(_Live(jobs, nodes, reconnects, store))
        self._jobs = jobs
        self.round = Histogram("hfai_scheduling_round_seconds", "Duration of one leader round (nodes, policy, "
                               "writes)", buckets=ROUND_BUCKETS, registry=r)
        self.hist = {
            "submit_to_running": Histogram("hfai_job_submit_to_running_seconds", "Submit to first start of a job",
                                           buckets=WAIT_BUCKETS, registry=r),
            "suspend_to_released": Histogram("hfai_job_suspend_to_released_seconds", "A job asked to suspend "
                                             "until its nodes were released", buckets=RELEASE_BUCKETS, registry=r),
        }
        self.leading = Gauge("hfai_controller_leading", "1 while this replica holds the lease", registry=r)
        self.rounds = Counter("hfai_scheduling_rounds", "Leader rounds run", registry=r)
        self._seen: set[str] | None = None

    def time_rounds(self, leader) -> None:
        """Time each round of ``leader`` (wraps its ``tick``)."""
        tick = leader.tick

        async def timed() -> None:
            start = time.perf_counter()
            try:
                await tick()
            finally:
                self.round.observe(time.perf_counter() - start)
                self.rounds.inc()

        leader.tick = timed

    def scan(self, leading: bool) -> None:
        """Observe latencies of records not seen before (the first scan only marks what exists)."""
        self.leading.set(1 if leading else 0)
        found = [(h, key, s) for j in self._jobs() for h, key, s in latencies(j)]
        keys = {f"{h}/{key}" for h, key, _ in found}
        if self._seen is not None and leading:
            for h, key, s in found:
                if f"{h}/{key}" not in self._seen:
                    self.hist[h].observe(s)
        self._seen = keys

    async def run(self, leading: Callable[[], bool], every_s: float = 1.0) -> None:
        while True:
            self.scan(leading())
            await asyncio.sleep(every_s)
