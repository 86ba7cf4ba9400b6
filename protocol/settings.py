"""The cluster's settings and accounts on the wire: quotas, drained nodes and restricted users
(KV ``hfai_users``), the leader lease, the API's settings verbs, and GPU-hour usage.
"""

from __future__ import annotations

from dataclasses import field
from typing import ClassVar

from hfai.protocol.messages import message
from hfai.protocol.nodes import GPUS_PER_NODE


@message("leader_lease")
class LeaderLease:
    KIND: ClassVar[str]
    holder: str
    since: float


@message("quota_entry")
class QuotaEntry:
    """At most ``nodes`` nodes for ``user``'s jobs of ``priority`` in ``group`` ("*" = any)."""

    KIND: ClassVar[str]
    user: str
    priority: int
    group: str
    nodes: int


@message("quota_table")
class QuotaTable:
    """All quotas (KV ``hfai_users``, key ``quotas``). No matching entry means no limit."""

    KIND: ClassVar[str]
    entries: tuple[QuotaEntry, ...] = ()


@message("drained_nodes")
class DrainedNodes:
    """Nodes an operator took out of service (KV ``hfai_users``, key ``drained``): node -> why."""

    KIND: ClassVar[str]
    nodes: dict[str, str] = field(default_factory=dict)


@message("restricted_users")
class RestrictedUsers:
    """Users who may not submit and whose jobs may not run (KV ``hfai_users``, key ``restricted``):
    user -> why. The scheduler suspends their running jobs through the normal interrupt protocol
    and keeps the rest waiting; lifting the restriction lets them all resume."""

    KIND: ClassVar[str]
    users: dict[str, str] = field(default_factory=dict)


# --------------------------------------------------------------------- the API's settings verbs

@message("quota_set_request")
class QuotaSetRequest:
    """Set (``nodes`` >= 0) or remove (``nodes`` < 0) one quota. Operators only."""

    KIND: ClassVar[str]
    entry: QuotaEntry


@message("quotas_request")
class QuotasRequest:
    KIND: ClassVar[str]


@message("drain_request")
class DrainRequest:
    """Take a node out of service (``drain``) or back in. Operators only."""

    KIND: ClassVar[str]
    node: str
    drain: bool = True
    reason: str = ""


@message("settings_reply")
class SettingsReply:
    KIND: ClassVar[str]
    quotas: QuotaTable
    drained: DrainedNodes
    # Levels above this need a quota ([controller] quota_needed_above; -1: a controller too old to
    # say, which closed none).
    quota_needed_above: int = -1


# ---------------------------------------------------------------------------------------- usage

@message("usage_entry")
class UsageEntry:
    """One run of a job and what it held (KV ``hfai_usage``, key ``<job id>.<run id>``): written
    by the controllers when the run has ended, so usage outlives the purged job record."""

    KIND: ClassVar[str]
    job_id: str
    run_id: int
    user: str
    group: str
    priority: int
    nodes: int
    start_ts: float
    end_ts: float
    gpus_per_node: int = GPUS_PER_NODE


@message("usage_request")
class UsageRequest:
    """GPU-hours from ``since_ts`` to ``until_ts`` (0: now), per UTC day, user, group, priority."""

    KIND: ClassVar[str]
    since_ts: float = 0.0
    until_ts: float = 0.0


@message("usage_row")
class UsageRow:
    KIND: ClassVar[str]
    day: str
    user: str
    group: str
    priority: int
    gpu_hours: float
    runs: int


@message("usage_reply")
class UsageReply:
    KIND: ClassVar[str]
    rows: tuple[UsageRow, ...]

