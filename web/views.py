"""What the pages show (pure): job rows filtered and sorted, a job's detail, node and cluster
summaries. JSON-ready dicts; the handlers only fetch and serialise."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from hfai.api.present import quota_defaults, throughput_lines
from hfai.protocol.reasons import describe
from hfai.protocol.types import JobRecord, NodeInfo, NodeState, Priority, QuotaTable

SORT_KEYS = {
    "id": lambda j: j.id,
    "name": lambda j: j.spec.name,
    "user": lambda j: j.spec.user,
    "priority": lambda j: j.spec.priority,
    "state": lambda j: j.state.value,
    "nodes": lambda j: j.spec.nodes,
    "submitted": lambda j: j.submit_ts,
    "suspends": lambda j: j.suspend_count,
}


def job_row(j: JobRecord) -> dict:
    return {"id": j.id, "name": j.spec.name, "user": j.spec.user, "group": j.spec.group,
            "priority": Priority.label(j.spec.priority), "state": j.state.value, "nodes": j.spec.nodes,
            "on": list(j.nodes), "suspends": j.suspend_count, "submitted": j.submit_ts, "reason": describe(j),
            "kind": j.spec.kind}


def job_rows(jobs: Iterable[JobRecord], user: str = "", state: str = "", priority: str = "", name: str = "",
             sort: str = "submitted", desc: bool = True) -> list[dict]:
    """Rows of the jobs matching every given filter (user and state exact, priority by label or
    number, name a substring), sorted by ``sort`` (unknown: submitted)."""
    want_prio = None
    if priority:
        want_prio = Priority.parse(priority)
    picked = [j for j in jobs if (not user or j.spec.user == user) and (not state or j.state.value == state)
              and (want_prio is None or j.spec.priority == want_prio) and (not name or name in j.spec.name)]
    key = SORT_KEYS.get(sort, SORT_KEYS["submitted"])
    picked.sort(key=lambda j: (key(j), j.id), reverse=desc)
    return [job_row(j) for j in picked]


def job_detail(j: JobRecord) -> dict:
    """Everything the job page shows: spec, state, why it waits, nodes, the history as a timeline."""
    s = j.spec
    return {**job_row(j), "spec": {"entrypoint": list(s.entrypoint), "workdir": s.workdir, "nodes": s.nodes,
                                   "min_nodes": s.min_nodes, "max_nodes": s.max_nodes, "env_name": s.env_name,
                                   "env": dict(s.env)},
            "run_id": j.run_id, "last_nodes": list(j.last_nodes), "ranks": len(j.nodes or j.last_nodes),
            "started": j.started_ts, "ended": j.ended_ts, "waiting": j.state.waiting,
            # What its runs used (their cgroups): one rank's peak memory, all runs' CPU time.
            "peak_bytes": j.peak_bytes, "cpu_s": round(j.cpu_s, 3),
            # Its measured throughput and GPU use per size, an elastic job's fitted curve (flat
            # past a size its GPUs sat idle at), its restart cost: one line each.
            "throughput": throughput_lines(j),
            # Its log watchdog as its nodes last said (None: none, or not running).
            "watchdog": None if j.watchdog is None else {
                "watchdog_s": j.watchdog.watchdog_s, "silent_s": round(j.watchdog.silent_s, 3),
                "node": j.watchdog.node, "ts": j.watchdog.ts},
            "history": [{"ts": e.ts, "state": e.state.value, "reason": describe(e)} for e in j.history]}


def node_row(info: NodeInfo, now: float, names: dict[str, str] | None = None) -> dict:
    """A node's row; its jobs as {id, name} (``names``: job id -> name, the id where unknown)."""
    r = info.record
    gpus = r.gpus
    return {"name": r.name, "group": r.group, "state": info.state.value, "reason": info.reason,
            "jobs": [{"id": j, "name": (names or {}).get(j, j)} for j in info.jobs], "age_s": info.age_s,
            "last_seen": r.ts, "stale": info.state is NodeState.DOWN,
            "gpus": len(gpus), "util": sum(g.utilization for g in gpus) / len(gpus) if gpus else 0.0,
            "mem_used": sum(g.memory_used for g in gpus), "mem_total": sum(g.memory_total for g in gpus),
            "health": node_health(r)}


def node_health(r) -> str:
    """The node's health in a line (docs/health.md): the fault that drains it, the validator's
    last check, its latest faults, and how its runs are contained when something is missing."""
    parts = []
    if r.fault is not None:
        parts.append(f"fault: {r.fault.text()}")
    if r.check is not None:
        at = time.strftime("%H:%M:%S", time.localtime(r.check.ts))
        parts.append(f"check passed in {r.check.duration_s:.2f}s at {at}" if r.check.ok
                     else f"check failed at {at}: {r.check.detail}")
        if r.check.bus_gbps:  # the in-node all-reduce ran
            parts[-1] += f" (all-reduce {r.check.bus_gbps:.2f} GB/s)"
    if r.faults:
        parts.append(f"{len(r.faults)} recent fault(s), latest: {r.faults[-1].text()}")
    if r.containment and r.containment not in ("bwrap, cgroup v1", "bwrap, cgroup v2"):
        parts.append(r.containment)
    return "; ".join(parts)


def node_use(jobs: Iterable[JobRecord], by: str) -> dict[str, int]:
    """Nodes held now per user (``by="user"``) or per priority label."""
    out: dict[str, int] = {}
    for j in jobs:
        if j.state.holds_nodes:
            key = j.spec.user if by == "user" else Priority.label(j.spec.priority)
            out[key] = out.get(key, 0) + len(j.nodes)
    return out


NO_QUOTA = "no limit"
CLOSED = "none set: operators only"


def quotas_vs_use(quotas: QuotaTable, jobs: Sequence[JobRecord], needed_above: int = -1) -> list[dict]:
    """Each quota with the nodes its user's jobs of that priority (and group, unless "*") hold now;
    then, for what users hold now that no quota covers, a row saying what applies there: "no limit"
    at levels that need no quota, and closed to all but operators' jobs above ``needed_above`` (the
    controller's ``quota_needed_above``; -1: every level is open), so the table shows the use even
    where nothing is set."""
    rows = []
    for q in quotas.entries:
        held = sum(len(j.nodes) for j in jobs if j.state.holds_nodes and j.spec.priority == q.priority
                   and q.user in ("*", j.spec.user) and q.group in ("*", j.spec.group))
        rows.append({"user": q.user, "priority": Priority.label(q.priority), "group": q.group, "quota": q.nodes,
                     "used": held})
    free: dict[tuple[str, int], int] = {}
    for j in jobs:
        if j.state.holds_nodes and not any(q.priority == j.spec.priority and q.user in ("*", j.spec.user)
                                           and q.group in ("*", j.spec.group) for q in quotas.entries):
            key = (j.spec.user, j.spec.priority)
            free[key] = free.get(key, 0) + len(j.nodes)
    for (user, prio), held in sorted(free.items(), key=lambda kv: (kv[0][0], -kv[0][1])):
        rows.append({"user": user, "priority": Priority.label(prio), "group": "*",
                     "quota": CLOSED if 0 <= needed_above < prio else NO_QUOTA, "used": held})
    return rows


def quota_note(quotas: QuotaTable, needed_above: int = -1) -> str:
    """What the quotas table means, above all when it is empty: the defaults, worded as the CLI's."""
    defaults = quota_defaults(needed_above)
    defaults = defaults[0].upper() + defaults[1:]
    if "hfai quota set" not in defaults:
        defaults += ". An operator sets a quota with `hfai quota set USER PRIORITY NODES`."
    if not quotas.entries:
        return f"No quotas are set. {defaults}"
    return f"{len(quotas.entries)} quota(s) set; where none matches a user, priority and group: {defaults}"


def cluster_summary(jobs: Sequence[JobRecord], nodes: Sequence[NodeInfo], quotas: QuotaTable,
                    now: float | None = None, needed_above: int = -1) -> dict:
    now = time.time() if now is None else now
    up = [n for n in nodes if n.state is NodeState.UP]
    busy = {name for j in jobs if j.state.holds_nodes for name in j.nodes}
    return {"nodes": len(nodes), "up": len(up), "busy": len(busy & {n.record.name for n in nodes}),
            "queued": sum(j.state.waiting for j in jobs), "running": sum(j.state.holds_nodes for j in jobs),
            "by_user": node_use(jobs, "user"), "by_priority": node_use(jobs, "priority"),
            "quotas": quotas_vs_use(quotas, jobs, needed_above), "quota_note": quota_note(quotas, needed_above),
            "quota_default": NO_QUOTA if not 0 <= needed_above < max(Priority) else
            f"no limit up to {Priority.label(needed_above)}, above it {CLOSED}", "now": now}
