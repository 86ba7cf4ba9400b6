"""What the pure policy sees: job records and operator settings turned into policy inputs."""

from __future__ import annotations

import math

from hfai.config import ControllerConfig
from hfai.controller.policy import JobView, PolicyConfig, Quotas
from hfai.protocol.types import DrainedNodes, JobRecord, QuotaTable


def job_view(j: JobRecord) -> JobView:
    s = j.spec
    return JobView(
        id=j.id, user=s.user, priority=s.priority, nodes=s.nodes, submit_ts=j.submit_ts, state=j.state,
        group=s.group, held=j.nodes, started_ts=j.started_ts, slice_turns=j.slice_turns,
        min_nodes=s.min_nodes, max_nodes=s.max_nodes, run_s=j.run_s, queued_ts=j.queued_ts,
    )


def quotas_of(table: QuotaTable | None) -> Quotas:
    if table is None:
        return Quotas()
    return Quotas(limits={(e.user, e.priority, e.group): e.nodes for e in table.entries})


def policy_config(cc: ControllerConfig, quotas: QuotaTable | None) -> PolicyConfig:
    return PolicyConfig(
        slice_s=cc.slice_s,
        above_normal_s=cc.above_normal_s if cc.above_normal_s > 0 else math.inf,
        quotas=quotas_of(quotas),
    )


def drained(settings: DrainedNodes | None) -> dict[str, str]:
    return dict(settings.nodes) if settings is not None else {}

