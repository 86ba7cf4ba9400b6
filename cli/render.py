"""Plain-text tables for the CLI (pure functions of protocol records, easy to test).

Every text that came from somebody else — job names, commands, reasons, user, group and node names
— goes through :func:`clean` before it reaches a terminal: a job name holding escape sequences
would otherwise repaint the screen of whoever runs ``hfai ps``.
"""

from __future__ import annotations

import time
import unicodedata

from hfai.protocol.types import JobRecord, NodeInfo, NodeState, Priority


def clean(text: object) -> str:
    """``text`` with every non-printable character (C0/C1 controls such as ESC, DEL, line breaks,
    bidi overrides, zero-width and other format characters; spaces of any width stay) written as a
    visible escape (``\\x1b``, ``\\n``, ``\\u202e``), so the terminal shows it instead of obeying it."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or unicodedata.category(c) == "Zs" else _escape(c) for c in text)


def _escape(c: str) -> str:
    special = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c)
    if special:
        return special
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def age(seconds: float) -> str:
    """Compact age: 42s, 5m, 3h, 2d."""
    seconds = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def table_text(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return "\n".join(lines)


#: The narrowest WHY column a terminal gets, however wide the other columns are.
MIN_WHY = 20


def jobs_table(jobs: tuple[JobRecord, ...] | list[JobRecord], now: float | None = None,
               empty: str = "no jobs", width: int | None = None) -> str:
    """The ``hfai ps`` table. With ``width`` (the terminal's columns) WHY is cut so each line fits
    (but never below :data:`MIN_WHY` characters); without it (output to a file or a pipe) WHY is
    whole, so nothing a script greps for is lost."""
    if not jobs:
        return empty
    now = time.time() if now is None else now
    headers = ["ID", "NAME", "USER", "NODES", "PRIORITY", "STATE", "SUSPENDS", "AGE", "WHY"]
    rows = [
        [clean(j.id), clean(j.spec.name), clean(j.spec.user), nodes_cell(j), Priority.label(j.spec.priority),
         j.state.value, str(j.suspend_count), age(now - j.submit_ts), clean(j.reason)]
        for j in jobs
    ]
    if width is not None:
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
        f"state      {j.state.value}: {clean(j.reason)}",
        f"nodes      {f'{s.min_nodes}-{s.max_nodes} (elastic)' if s.elastic else s.nodes} requested; "
        f"{_where(j)}",
        f"runs       {j.run_id} (suspended {j.suspend_count} times)   whole-life state {j.whole_life_state}",
        f"command    {clean(' '.join(s.entrypoint))}",
        f"workdir    {clean(s.workdir)}" + (f"   env {clean(s.env_name)}" if s.env_name else ""),
        "history:",
    ]
    for ev in j.history:
        lines.append(f"  {time.strftime('%H:%M:%S', time.localtime(ev.ts))}  {ev.state.value:<11} {clean(ev.reason)}")
    return "\n".join(lines)


def quotas_table(table) -> str:
    if not table.entries:
        return "no quotas (no limits)"
    rows = [[clean(q.user), Priority.label(q.priority), clean(q.group), str(q.nodes)]
            for q in sorted(table.entries, key=lambda q: (q.user, -q.priority, q.group))]
    return table_text(["USER", "PRIORITY", "GROUP", "NODES"], rows)


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
        rows.append([clean(n.record.name), clean(n.record.group), n.state.value, *figures,
                     clean(n.record.gpu_source), f"{n.age_s:.1f}s", clean(",".join(n.jobs)) or "-", "; ".join(why)])
    return table_text(["NODE", "GROUP", "STATE", "GPUS BUSY", "UTIL", "GPU MEMORY", "SOURCE", "HEARTBEAT", "JOBS",
                       "REASON"], rows)
