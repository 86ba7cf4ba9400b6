"""What the pure policy sees: job records and operator settings turned into policy inputs."""

from __future__ import annotations

import math

from hfai.controller.policy import JobView, PolicyConfig
from hfai.core.config import ControllerConfig
from hfai.protocol.quotas import quotas_of
from hfai.protocol.speedup import persistent_utilization
from hfai.protocol.types import JOB_DEV, DrainedNodes, JobRecord, QuotaTable


def job_view(j: JobRecord) -> JobView:
    s = j.spec
    return JobView(
        id=j.id, user=s.user, priority=s.priority, nodes=s.nodes, submit_ts=j.submit_ts, state=j.state,
        group=s.group, held=j.nodes, started_ts=j.started_ts, slice_turns=j.slice_turns,
        min_nodes=s.min_nodes, max_nodes=s.max_nodes, run_s=j.run_s, queued_ts=j.queued_ts,
        exempt=s.by_operator, dev=s.kind == JOB_DEV, name=s.name,
        throughput=tuple((r.nodes, r.rate) for r in j.throughput), throughput_unit=j.throughput_unit,
        restart_s=j.restart_s, gpu_util=persistent_utilization(j.throughput),
    )


def policy_config(cc: ControllerConfig, quotas: QuotaTable | None) -> PolicyConfig:
    return PolicyConfig(
        slice_s=cc.slice_s,
        above_normal_s=cc.above_normal_s if cc.above_normal_s > 0 else math.inf,
        quotas=quotas_of(quotas, cc.quota_needed_above),
        resize_cost_s=cc.resize_cost_s,
    )


def drained(settings: DrainedNodes | None) -> dict[str, str]:
    return dict(settings.nodes) if settings is not None else {}

