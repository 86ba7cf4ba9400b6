"""Plain-text tables for the CLI (pure functions of protocol records, easy to test).

Every text that came from somebody else — job names, commands, reasons, user, group and node names
— goes through :func:`clean` before it reaches a terminal: a job name holding escape sequences
would otherwise repaint the screen of whoever runs ``hfai ps``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from hfai.api.present import age, clean, quota_defaults, throughput_lines
from hfai.protocol._lazy import frozen_dataclass
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.reasons import describe
from hfai.protocol.types import ChainState, JobRecord, NodeInfo, NodeState, Priority, QuotaTable, StoreHealth


def table_text(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


#: The narrowest WHY column a terminal gets, however wide the other columns are.
MIN_WHY = 20


class Column(NamedTuple):
    """One column ``hfai ps -o`` may show: its header, what it means, and its cell (pure). A named
    tuple: the listing makes all of them at import, where each dataclass would cost every call."""

    header: str
    help: str
    cell: Callable[[JobRecord, float], str]


def _stamp(ts: float) -> str:
    """Local time, one token (no space: a column stays one field for awk): 2024-05-01T13:45:07."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) if ts > 0 else "-"


def run_seconds(j: JobRecord, now: float) -> float:
    """Seconds the job has run over all its runs, the current one up to ``now``. ``run_s`` holds
    the runs that were interrupted; a run still going, or the one that ended the job, is added."""
    total = j.run_s
    if j.started_ts > 0:
        if j.state.holds_nodes:
            total += max(0.0, now - j.started_ts)
        elif j.state.final and j.ended_ts and len(j.history) >= 2 and j.history[-2].state.holds_nodes:
            total += max(0.0, j.ended_ts - j.started_ts)
    return total


def held_by(j: JobRecord) -> str:
    """Who put a waiting job on hold ("" if nobody)."""
    return j.hold


#: The columns of ``hfai ps -o``, in the order ``hfai ps --help`` lists them.
JOB_COLUMNS: dict[str, Column] = {
    "id": Column("ID", "job id", lambda j, now: clean(j.id)),
    "name": Column("NAME", "job name", lambda j, now: clean(j.spec.name)),
    "user": Column("USER", "submitter", lambda j, now: clean(j.spec.user)),
    "group": Column("GROUP", "node group", lambda j, now: clean(j.spec.group)),
    "nodes": Column("NODES", "nodes asked for (elastic: held of MIN-MAX)", lambda j, now: nodes_cell(j)),
    "priority": Column("PRIORITY", "priority level", lambda j, now: Priority.label(j.spec.priority)),
    "state": Column("STATE", "chain state", lambda j, now: j.state.value),
    "held": Column("HELD", "who holds the waiting job (hfai hold), else -", lambda j, now: clean(held_by(j)) or "-"),
    "suspends": Column("SUSPENDS", "times interrupted", lambda j, now: str(j.suspend_count)),
    "runs": Column("RUNS", "runs started", lambda j, now: str(j.run_id)),
    "submitted": Column("SUBMITTED", "submit time (local)", lambda j, now: _stamp(j.submit_ts)),
    "started": Column("STARTED", "start of the latest run (local)", lambda j, now: _stamp(j.started_ts)),
    "ended": Column("ENDED", "when it ended (local)", lambda j, now: _stamp(j.ended_ts)),
    "age": Column("AGE", "since submitted", lambda j, now: age(now - j.submit_ts)),
    "runtime": Column("RUNTIME", "run time over all runs", lambda j, now: age(run_seconds(j, now))),
    "where": Column("WHERE", "nodes held now", lambda j, now: clean(",".join(j.nodes)) if j.state.holds_nodes
                    and j.nodes else "-"),
    "command": Column("COMMAND", "what it runs", lambda j, now: clean(" ".join(j.spec.entrypoint))),
    "why": Column("WHY", "the reason for its state", lambda j, now: clean(describe(j))),
}
DEFAULT_COLUMNS = ("id", "name", "user", "nodes", "priority", "state", "suspends", "age", "why")


def _name_key(j: JobRecord) -> tuple:
    # An array's members (NAME[i]) by index, not as text (sweep[10] after sweep[9]).
    return (j.spec.name.rsplit("[", 1)[0] if j.spec.array_id else j.spec.name, j.spec.array_index, j.spec.name)


#: What ``hfai ps --sort`` sorts by, per column: the value, not the cell's text.
SORT_KEYS: dict[str, Callable[[JobRecord, float], Any]] = {
    "id": lambda j, now: j.id,
    "name": lambda j, now: _name_key(j),
    "user": lambda j, now: j.spec.user,
    "group": lambda j, now: j.spec.group,
    "nodes": lambda j, now: j.spec.nodes,
    "priority": lambda j, now: j.spec.priority,
    "state": lambda j, now: j.state.value,
    "held": lambda j, now: held_by(j),
    "suspends": lambda j, now: j.suspend_count,
    "runs": lambda j, now: j.run_id,
    "submitted": lambda j, now: j.submit_ts,
    "started": lambda j, now: j.started_ts,
    "ended": lambda j, now: j.ended_ts,
    "age": lambda j, now: now - j.submit_ts,
    "runtime": lambda j, now: run_seconds(j, now),
}


def parse_sort(text: str) -> tuple[tuple[str, bool], ...]:
    """``--sort priority,-age``: column names (any case), each ``-`` first for descending;
    InvalidRequest names an unknown one."""
    wanted = []
    for part in (p.strip().lower() for p in text.split(",")):
        if not part:
            continue
        key, desc = (part[1:], True) if part.startswith("-") else (part, False)
        if key not in SORT_KEYS:
            raise InvalidRequest(f"cannot sort by {key[:40]!r}: --sort takes a comma-separated list of "
                                 f"{', '.join(SORT_KEYS)}, each with - first for descending")
        wanted.append((key, desc))
    if not wanted:
        raise InvalidRequest("--sort: no column given")
    return tuple(wanted)


def sort_jobs(jobs: Sequence[JobRecord], keys: Sequence[tuple[str, bool]], now: float) -> list[JobRecord]:
    """``jobs`` sorted by ``keys`` (first key first; ties keep the listing's order)."""
    out = list(jobs)
    for key, desc in reversed(keys):
        out.sort(key=lambda j: SORT_KEYS[key](j, now), reverse=desc)
    return out


def parse_columns(text: str) -> tuple[str, ...]:
    """Column names from ``-o id,name,state`` (any case); InvalidRequest names the unknown one."""
    wanted = tuple(c.strip().lower() for c in text.split(",") if c.strip())
    unknown = [c for c in wanted if c not in JOB_COLUMNS]
    if unknown or not wanted:
        what = f"unknown column {unknown[0][:40]!r}" if unknown else "no columns given"
        raise InvalidRequest(f"{what}: -o takes a comma-separated list of {', '.join(JOB_COLUMNS)}")
    return wanted


def jobs_table(jobs: Sequence[JobRecord], now: float | None = None, empty: str = "no jobs",
               width: int | None = None, columns: Sequence[str] = DEFAULT_COLUMNS) -> str:
    """The ``hfai ps`` table. With ``width`` (the terminal's columns) a last WHY column is cut so
    each line fits (but never below :data:`MIN_WHY` characters); without it (output to a file or a
    pipe, or ``--wide``) every cell is whole, so nothing a script greps for is lost."""
    if not jobs:
        return empty
    now = time.time() if now is None else now
    cols = [JOB_COLUMNS[c] for c in columns]
    headers = [c.header for c in cols]
    rows = [[c.cell(j, now) for c in cols] for j in jobs]
    if width is not None and columns[-1] == "why":
        used = sum(max(len(h), *(len(r[i]) for r in rows)) + 2 for i, h in enumerate(headers[:-1]))
        for r in rows:
            r[-1] = _short(r[-1], max(MIN_WHY, width - used))
    return table_text(headers, rows)


def nodes_cell(j: JobRecord) -> str:
    """What a job asks for, and for an elastic job what it holds now: "1 of 1-4" (it runs on 1)."""
    s = j.spec
    if not s.elastic:
        return str(s.nodes)
    wanted = f"{s.min_nodes}-{s.max_nodes}"
    return f"{len(j.nodes)} of {wanted}" if j.state.holds_nodes and j.nodes else wanted


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _where(j: JobRecord) -> str:
    """The nodes a job holds now, or where it last ran: a finished job holds nothing."""
    if j.state.holds_nodes and j.nodes:
        return f"{clean(', '.join(j.nodes))} now"
    last = j.last_nodes or j.nodes
    return f"last ran on {clean(', '.join(last))}" if last else "none yet"


def job_details(j: JobRecord) -> str:
    s = j.spec
    lines = [
        f"job        {clean(s.name)} ({clean(j.id)})",
        f"user       {clean(s.user)}   group {clean(s.group)}   priority {Priority.label(s.priority)}",
        f"state      {j.state.value}: {clean(describe(j))}",
        f"nodes      {f'{s.min_nodes}-{s.max_nodes} (elastic)' if s.elastic else s.nodes} requested; "
        f"{_where(j)}",
        f"runs       {j.run_id} (suspended {j.suspend_count} times, run time {age(run_seconds(j, time.time()))})   "
        f"whole-life state {j.whole_life_state}",
        f"command    {clean(' '.join(s.entrypoint))}",
        f"workdir    {clean(s.workdir)}" + (f"   env {clean(s.env_name)}" if s.env_name else ""),
        *_env_lines(s.env),
        *_extras(j),
        "history:",
    ]
    # GPU faults under its runs among the states it entered, by time.
    for ev in sorted((*j.history, *j.faults), key=lambda e: e.ts):
        at = time.strftime('%H:%M:%S', time.localtime(ev.ts))
        lines.append(f"  {at}  {ev.state.value:<11} {clean(describe(ev))}")
    return "\n".join(lines)


#: What the controller shows instead of another user's environment values (controller/api.py).
HIDDEN = "<hidden>"


def _env_lines(env: dict[str, str]) -> list[str]:
    """The job's -e variables, one a line (the controller has already hidden the values from
    anyone but the owner and operators)."""
    items = sorted(env.items())
    lines = [f"{'variables' if i == 0 else '':<11}{clean(k)}={clean(v)}" for i, (k, v) in enumerate(items)]
    if any(v == HIDDEN for v in env.values()):
        lines.append(f"{'':<11}(values are shown to the job's owner and operators only)")
    return lines


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _extras(j: JobRecord) -> list[str]:
    """Lines for what only some jobs have (a hold, dependencies, limits, a watchdog, an array)."""
    s = j.spec
    lines = []
    if held_by(j):
        lines.append(f"held       by {clean(held_by(j))} (hfai release starts it again)")
    if s.after:
        lines.append(f"after      {clean(', '.join(s.after))}")
    if s.time_limit_s > 0:
        lines.append(f"time limit {age(s.time_limit_s)} (run {age(run_seconds(j, time.time()))} so far)")
    if s.retries:
        lines.append(f"retries    {j.retried} of {s.retries} used")
    watch = j.watchdog  # its nodes' latest heartbeats (none for a dev session)
    if watch is not None:
        at = time.strftime("%H:%M:%S", time.localtime(watch.ts))
        lines.append(f"watchdog   {age(watch.watchdog_s)} without output ends it as hung; silent for "
                     f"{age(watch.silent_s)} (on {clean(watch.node)} at {at})")
    peak, cpu = j.peak_bytes, j.cpu_s
    if peak or cpu:
        lines.append(f"resources  peak memory {_size(peak)} (one rank's run, at most), CPU time {age(cpu)} (all runs)")
    # Its throughput and GPU use per size, its curve, its restart cost: one item a line.
    lines.extend(f"{'throughput' if i == 0 else '':<11}{line}" for i, line in enumerate(throughput_lines(j)))
    if s.array_id:
        lines.append(f"array      {clean(s.array_id)} index {s.array_index}"
                     + (f" (at most {s.array_limit} at once)" if s.array_limit else ""))
    return lines


def quotas_table(table, needed_above: int = -1) -> str:
    if not table.entries:
        return "no quotas set\n" + quota_defaults(needed_above)
    rows = [[clean(q.user), Priority.label(q.priority), clean(q.group), str(q.nodes)]
            for q in sorted(table.entries, key=lambda q: (q.user, -q.priority, q.group))]
    return table_text(["USER", "PRIORITY", "GROUP", "NODES"], rows) + "\n" + quota_defaults(needed_above)


def store_line(health: StoreHealth | None, now: float) -> str | None:
    """The line `hfai nodes` adds when the NATS store refuses writes (None while it takes them)."""
    if health is None or health.writable:
        return None
    return (f"NATS store: REFUSING WRITES for {age(now - health.since)} ({health.failures} probe writes failed "
            f"in a row: {clean(health.detail)}); nothing changes until it takes writes again: free space on the "
            "NATS server's disk, then restart nats-server (`hfai local up` does it on a local cluster)")


#: A node's containment line when its runs get all of it (agent/contain.py: Containment.summary).
FULLY_CONTAINED = ("bwrap, cgroup v1", "bwrap, cgroup v2")


def nodes_table(nodes: tuple[NodeInfo, ...] | list[NodeInfo]) -> str:
    """One row per node. A node without heartbeat still has the GPU figures of its last one:
    they are shown in parentheses, and REASON says how old they are."""
    if not nodes:
        return "no nodes"
    rows = []
    for n in nodes:
        gpus = n.record.gpus
        busy = sum(1 for g in gpus if g.utilization > 5.0)
        util = sum(g.utilization for g in gpus) / len(gpus) if gpus else 0.0
        used = sum(g.memory_used for g in gpus) / 2**30
        total = sum(g.memory_total for g in gpus) / 2**30
        figures = [f"{busy}/{len(gpus)}", f"{util:.0f}%", f"{used:.0f}/{total:.0f} GiB"]
        down = n.state is NodeState.DOWN
        if down:
            figures = [f"({f})" for f in figures]
        why = [f"no heartbeat for {age(n.age_s)}, figures are from then"] if down else []
        if n.reason:
            why.append(f"drained: {clean(n.reason)}" if down else clean(n.reason))
        check = n.record.check  # the node validator's last run
        if check is not None and not check.ok:
            why.append(f"health check failed: {clean(check.detail)}")
        contained = n.record.containment  # says what is missing, if anything
        if contained and contained not in FULLY_CONTAINED:
            why.append(clean(contained))
        rows.append([clean(n.record.name), clean(n.record.group), n.state.value, *figures,
                     clean(n.record.gpu_source), f"{n.age_s:.1f}s", clean(",".join(n.jobs)) or "-", "; ".join(why)])
    return table_text(["NODE", "GROUP", "STATE", "GPUS BUSY", "UTIL", "GPU MEMORY", "SOURCE", "HEARTBEAT", "JOBS",
                       "REASON"], rows)


# ----------------------------------------------------------------------------------------- JSON
# ``--json`` output: a documented, stable shape (docs/cli.md) that later versions only extend. It
# is not cleaned (a program reads it, not a terminal) but json.dumps writes every non-ASCII and
# control character as a \u escape, so printing it cannot drive a terminal either.

def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=True)


def _ts(ts: float) -> float | None:
    return ts if ts > 0 else None


def job_json(j: JobRecord, now: float | None = None, history: bool = False) -> dict[str, Any]:
    """One job as ``hfai ps --json`` lists it (``hfai status --json`` adds ``history``)."""
    now = time.time() if now is None else now
    s = j.spec
    out: dict[str, Any] = {
        "id": j.id, "name": s.name, "user": s.user, "group": s.group,
        "state": j.state.value, "reason": describe(j),
        "priority": s.priority, "priority_name": Priority.label(s.priority),
        "nodes": s.nodes, "min_nodes": s.min_nodes or s.nodes, "max_nodes": s.max_nodes or s.nodes,
        "nodes_held": list(j.nodes) if j.state.holds_nodes else [], "last_nodes": list(j.last_nodes or j.nodes),
        "held_by": held_by(j) or None,
        "submitted": j.submit_ts, "started": _ts(j.started_ts), "ended": _ts(j.ended_ts),
        "runtime_s": round(run_seconds(j, now), 3), "runs": j.run_id, "suspend_count": j.suspend_count,
        "whole_life_state": j.whole_life_state,
        "command": list(s.entrypoint), "workdir": s.workdir, "env_name": s.env_name, "env": dict(s.env),
        "after": list(s.after), "time_limit_s": float(s.time_limit_s),
        "retries": s.retries, "retried": j.retried,
        "array_id": s.array_id or None, "array_index": _index(s.array_index),
        "peak_memory_bytes": j.peak_bytes, "cpu_s": round(float(j.cpu_s), 3),
        "watchdog": _watch_json(j.watchdog),
    }
    if history:
        out["history"] = [{"ts": ev.ts, "state": ev.state.value, "reason": describe(ev)} for ev in j.history]
        out["faults"] = [{"ts": ev.ts, "reason": describe(ev)} for ev in j.faults]
    return out


def _watch_json(w) -> dict | None:
    """The job's log watchdog (``hfai status --json``; only a status reply carries it)."""
    if w is None:
        return None
    return {"watchdog_s": w.watchdog_s, "silent_s": round(w.silent_s, 3), "node": w.node, "ts": w.ts}


def _index(i: int) -> int | None:
    return i if i >= 0 else None


def node_json(n: NodeInfo) -> dict[str, Any]:
    """One node as ``hfai nodes --json`` lists it. ``stale``: the node is down and its figures are
    from its last heartbeat, ``heartbeat_age_s`` ago."""
    gpus = n.record.gpus
    return {
        "name": n.record.name, "group": n.record.group, "state": n.state.value, "reason": n.reason,
        "address": n.record.address, "heartbeat_age_s": round(n.age_s, 3), "stale": n.state is NodeState.DOWN,
        "gpu_source": n.record.gpu_source, "gpus": len(gpus),
        "gpus_busy": sum(1 for g in gpus if g.utilization > 5.0),
        "utilization": round(sum(g.utilization for g in gpus) / len(gpus), 2) if gpus else 0.0,
        "memory_used": sum(g.memory_used for g in gpus), "memory_total": sum(g.memory_total for g in gpus),
        "jobs": list(n.jobs),
        # How its runs are contained (docs/security.md): "bwrap, cgroup v1", or what is missing.
        "containment": n.record.containment or None,
        # Node health (docs/health.md): the fault that drains it, its latest faults, the last check.
        "fault": n.record.fault.text() if n.record.fault is not None else None,
        "faults": [{"ts": f.ts, "fault": f.text(), "hardware": f.hardware} for f in n.record.faults],
        "check": None if n.record.check is None else {
            "ts": n.record.check.ts, "ok": n.record.check.ok, "duration_s": round(n.record.check.duration_s, 3),
            "detail": n.record.check.detail, "bus_gbps": round(n.record.check.bus_gbps, 3)},
    }


def quotas_json(table: QuotaTable) -> list[dict[str, Any]]:
    """Every quota as ``hfai quota ls --json`` lists it."""
    return [{"user": q.user, "priority": q.priority, "priority_name": Priority.label(q.priority), "group": q.group,
             "nodes": q.nodes} for q in sorted(table.entries, key=lambda q: (q.user, -q.priority, q.group))]


# --------------------------------------------------------------------------------- my quota

@frozen_dataclass  # made at first use (hfai.protocol._lazy): only `hfai quota` needs it
class QuotaUse:
    """One (priority, group) of a user: the quota that applies (None: no limit), the nodes their
    jobs hold there now, and the nodes their waiting jobs ask for."""

    priority: int
    group: str
    limit: int | None
    used: int
    waiting: int

    def as_json(self) -> dict[str, Any]:
        return {"priority": self.priority, "priority_name": Priority.label(self.priority), "group": self.group,
                "limit": self.limit, "used": self.used, "waiting": self.waiting}


def quota_use(user: str, table: QuotaTable, jobs: Iterable[JobRecord], groups: Iterable[str],
              needed_above: int = -1) -> list[QuotaUse]:
    """``user``'s limits next to their use (pure), per priority and group: every level and group
    where a quota applies to them (the policy's rule: the most specific of user/any and group/any)
    or where their jobs hold or want nodes. Groups are those the nodes have and their jobs name."""
    from hfai.protocol.quotas import quotas_of

    quotas = quotas_of(table, needed_above if needed_above >= 0 else Priority.EXTREME_HIGH.value)
    used: dict[tuple[int, str], int] = {}
    waiting: dict[tuple[int, str], int] = {}
    for j in jobs:
        if j.spec.user != user:
            continue
        key = (j.spec.priority, j.spec.group)
        if j.state.holds_nodes:
            used[key] = used.get(key, 0) + len(j.nodes)
        elif j.state.waiting:
            waiting[key] = waiting.get(key, 0) + (j.spec.min_nodes if j.spec.elastic else j.spec.nodes)
    all_groups = sorted({*groups, *(g for _, g in used), *(g for _, g in waiting)})
    rows = []
    for level in sorted(Priority, reverse=True):
        for group in all_groups:
            key = (level.value, group)
            limit = quotas.limit(user, level.value, group)
            if limit is not None or key in used or key in waiting:
                rows.append(QuotaUse(level.value, group, limit, used.get(key, 0), waiting.get(key, 0)))
    return rows


def quota_use_table(user: str, rows: Sequence[QuotaUse], needed_above: int = -1) -> str:
    if not rows:
        return f"{clean(user)}: no quotas apply and no jobs hold or want nodes\n" + quota_defaults(needed_above)
    body = [[Priority.label(r.priority), clean(r.group), "no limit" if r.limit is None else str(r.limit), str(r.used),
             str(r.waiting), "-" if r.limit is None else str(max(0, r.limit - r.used))] for r in rows]
    return f"quotas of {clean(user)} (nodes):\n" + table_text(
        ["PRIORITY", "GROUP", "LIMIT", "HELD", "WAITING", "ROOM"], body) + "\n" + quota_defaults(needed_above)


def states_help() -> str:
    return ", ".join(s.value for s in ChainState)


class LineStamper:
    """``hfai logs --timestamps``: puts the time each line was read before it: the time the node
    read it from the job (``line_ts``, which agents keep with the log: hfai.agent.logtimes), else,
    where the node kept no time for it, the time this client received the line's first bytes. Fed
    from the log's start or a line's start; a line split across chunks is stamped once."""

    def __init__(self) -> None:
        self._at_line_start = True

    def feed(self, data: bytes, ts: float, line_ts: Sequence[float] = ()) -> bytes:
        """``data`` stamped; ``line_ts``: the time of each line that starts in it (LogChunk.line_ts;
        0.0 or missing: ``ts``)."""
        if not data:
            return data
        lines = data.split(b"\n")
        out = []
        started = 0  # lines started so far in data: the index into line_ts
        for i, part in enumerate(lines):
            last = i == len(lines) - 1
            if last and not part:
                break  # data ended with a newline: the next line is not here yet
            starts = self._at_line_start if i == 0 else True
            if starts:
                at = line_ts[started] if started < len(line_ts) and line_ts[started] > 0 else ts
                started += 1
            out.append((_line_stamp(at) if starts else b"") + part + (b"" if last else b"\n"))
        self._at_line_start = data.endswith(b"\n")
        return b"".join(out)


def _line_stamp(ts: float) -> bytes:
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts)) + f".{int(ts * 1000) % 1000:03d} ").encode()
