"""The plan's inputs from a controller replica's live state: its node tracker and the
operators' settings (the leader plans with them; any replica estimates start times with them)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import replace

from hfai.controller.nodes import NodeTracker, unknown_nodes
from hfai.controller.plan import PlanNode, PlanSettings
from hfai.controller.views import policy_config
from hfai.core.config import ControllerConfig
from hfai.protocol import names
from hfai.protocol.types import JobRecord, QuotaTable, RestrictedUsers


def plan_settings(cc: ControllerConfig, settings: Mapping[str, object], explain: bool = True) -> PlanSettings:
    """The plan's settings from the controller's configuration and the operators' settings (KV
    ``hfai_users``: quotas, restricted users)."""
    quotas, restricted = settings.get(names.QUOTAS_KEY), settings.get(names.RESTRICTED_KEY)
    return PlanSettings(
        policy=replace(policy_config(cc, quotas if isinstance(quotas, QuotaTable) else None), explain_waits=explain),
        restricted=dict(restricted.users) if isinstance(restricted, RestrictedUsers) else {},
        master_port_base=cc.master_port_base, master_port_span=cc.master_port_span,
        wait_reason_interval_s=cc.wait_reason_interval_s,
        retry_backoff_s=cc.retry_backoff_s, retry_backoff_max_s=cc.retry_backoff_max_s,
        ack_window_s=cc.ack_window_s, kill_window_s=cc.kill_window_s,
    )


def plan_nodes(tracker: NodeTracker, jobs: Iterable[JobRecord], led_s: float) -> list[PlanNode]:
    """The nodes as the plan sees them. Alive: heartbeating (else its jobs are requeued at once);
    faulty: a GPU reports a fatal error, or the node's health watch a hardware fault (its jobs are
    interrupted as a platform fault); also nodes that jobs hold but no record names any more, once
    the leader has led for a heartbeat window (``led_s``)."""
    now = time.monotonic()
    drained = tracker.drained()
    states = []
    for r in tracker.records():
        alive = tracker.heartbeating(r.name, now)
        faulty = any(g.fatal for g in r.gpus) or r.fault is not None
        states.append(PlanNode(r.name, r.group, alive, alive and not faulty and r.name not in drained,
                               r.address, faulty=faulty, fault=r.fault.text() if r.fault is not None else ""))
    for name in sorted(unknown_nodes(jobs, tracker.cache.values, led_s, tracker.timeout_s)):
        states.append(PlanNode(name, alive=False, schedulable=False))
    return states
