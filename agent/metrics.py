"""Prometheus metrics of one node's agent (``[agent] metrics_port``; 0: off, -1: a free port,
written to ``<state_dir>/metrics_port``): the node's GPU and host telemetry as of the last
heartbeat, the live runs, how long jobs took to acknowledge a suspend, NATS reconnects, and the
node's health: ``hfai_node_healthy`` and ``hfai_gpu_xid_total{code}``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from hfai.protocol.types import NodeRecord

ACK_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120)


class _Telemetry(Collector):
    def __init__(self, metrics: AgentMetrics):
        self._m = metrics

    def collect(self):
        r = self._m.record
        util = GaugeMetricFamily("hfai_gpu_utilization_ratio", "GPU utilisation (0-1)", labels=["node", "gpu"])
        mem = GaugeMetricFamily("hfai_gpu_memory_used_bytes", "GPU memory used", labels=["node", "gpu"])
        total = GaugeMetricFamily("hfai_gpu_memory_total_bytes", "GPU memory", labels=["node", "gpu"])
        temp = GaugeMetricFamily("hfai_gpu_temperature_celsius", "GPU temperature", labels=["node", "gpu"])
        power = GaugeMetricFamily("hfai_gpu_power_watts", "GPU power draw", labels=["node", "gpu"])
        host = GaugeMetricFamily("hfai_node_cpu_utilization_ratio", "Host CPU utilisation (0-1)", labels=["node"])
        hmem = GaugeMetricFamily("hfai_node_memory_used_bytes", "Host memory used", labels=["node"])
        runs = GaugeMetricFamily("hfai_node_runs", "Job runs alive on the node", labels=["node"])
        beat = GaugeMetricFamily("hfai_node_heartbeat_timestamp_seconds", "Time of the last heartbeat", labels=["node"])
        out = [util, mem, total, temp, power, host, hmem, runs, beat]
        if r is not None:
            for g in r.gpus:
                labels = [r.name, str(g.index)]
                util.add_metric(labels, g.utilization / 100.0)
                mem.add_metric(labels, g.memory_used)
                total.add_metric(labels, g.memory_total)
                temp.add_metric(labels, g.temperature)
                power.add_metric(labels, g.power_w)
            if r.host is not None:
                host.add_metric([r.name], r.host.cpu_percent / 100.0)
                hmem.add_metric([r.name], r.host.memory_used)
            runs.add_metric([r.name], len(r.runs))
            beat.add_metric([r.name], r.ts)
        rc = CounterMetricFamily("hfai_nats_reconnects", "Reconnections of this process to NATS")
        rc.add_metric([], self._m.reconnects())
        return [*out, rc, *self._health(r)]

    def _health(self, r: NodeRecord | None) -> list:
        healthy = GaugeMetricFamily("hfai_node_healthy", "1 while no hardware fault drains the node (docs/health.md)",
                                    labels=["node"])
        xid = CounterMetricFamily("hfai_gpu_xid", "GPU Xid errors seen on the node, by code", labels=["node", "code"])
        if r is not None:
            healthy.add_metric([r.name], 0.0 if r.fault is not None else 1.0)
            for code, n in sorted(self._m.xids().items()):
                xid.add_metric([r.name, str(code)], n)
        return [healthy, xid]


class AgentMetrics:
    def __init__(self, reconnects: Callable[[], int], xids: Callable[[], Mapping[int, int]] = dict):
        self.registry = CollectorRegistry()
        self.record: NodeRecord | None = None
        self.reconnects = reconnects
        self.xids = xids  # Xid code -> how many this agent saw
        self.registry.register(_Telemetry(self))
        self.suspend_ack = Histogram("hfai_job_suspend_ack_seconds", "Suspend flag raised to the job's "
                                     "acknowledgement", buckets=ACK_BUCKETS, registry=self.registry)
        self._asked: dict[str, float] = {}

    def heartbeat(self, record: NodeRecord) -> None:
        self.record = record

    def suspend_raised(self, key: str) -> None:
        self._asked.setdefault(key, time.monotonic())

    def suspend_acked(self, key: str) -> None:
        asked = self._asked.pop(key, None)
        if asked is not None:
            self.suspend_ack.observe(time.monotonic() - asked)
