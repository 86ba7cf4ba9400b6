"""What the CLI and the web page both show, worded once (the layers: both sit above this one, so
neither imports the other nor the controller for it): text made safe for a terminal, ages, an
elastic job's measured throughput and GPU use per size and its fitted curve, the quota defaults'
sentence, and usage reports' totals and CSV."""

from __future__ import annotations

import dataclasses
import unicodedata
from collections.abc import Iterable

from hfai.protocol.speedup import LOW_GPU_UTIL, UTIL_MIN_S, fit_points, idle_cap, persistent_utilization
from hfai.protocol.types import JobRecord, Priority, SizeRate, UsageRow

DAY_S = 86400.0


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


def throughput_lines(j: JobRecord) -> list[str]:
    """An elastic job's measured throughput, one line per size with how busy its nodes' GPUs were
    there, the speedup curve fitted to it, and its measured restart cost: what the scheduler sizes
    it by (docs/scheduling.md). A size it kept its GPUs mostly idle at is said to stop its growth,
    as the gain policy takes it (its default ``low_gpu_util``); the CLI labels the lines, the job
    page lists them."""
    rates = j.throughput
    if not rates:
        return []
    unit = clean(j.throughput_unit or "steps")
    s = j.spec
    # Only an elastic job is grown by its curve; at its largest size there is nothing to stop.
    stops = {r.nodes for r in rates if s.elastic and r.nodes < s.max_nodes}
    lines = [_size_line(r, unit, r.nodes in stops) for r in rates]
    if s.elastic:
        cap = idle_cap(persistent_utilization(rates))
        curve = dataclasses.replace(fit_points([(r.nodes, r.rate) for r in rates]), cap=cap)
        lines.append(f"fitted speedup on 1..{s.max_nodes} nodes: "
                     + " ".join(f"{curve.relative(n):.2f}" for n in range(1, s.max_nodes + 1))
                     + (f" (flat past {_nodes(cap)}: its GPUs sat idle there)" if 0 < cap < s.max_nodes else ""))
    restart = float(j.restart_s)
    if restart:
        lines.append(f"a restart costs it {age(restart)} (its latest interruption and start)")
    return lines


def _nodes(n: int) -> str:
    return f"{n} node{'s' if n != 1 else ''}"


def _size_line(r: SizeRate, unit: str, may_stop: bool) -> str:
    """"2 nodes: 41.2 steps/s, GPUs 35% busy (too idle to grow past)": the GPUs' share is the mean
    over its nodes' heartbeats while it ran at that size (none said: left out)."""
    line = f"{_nodes(r.nodes)}: {r.rate:.3g} {unit}/s"
    if r.gpu_util is None:
        return line
    line += f", GPUs {r.gpu_util:.0f}% busy"
    if may_stop and r.gpu_util < LOW_GPU_UTIL:
        line += (" (too idle to grow past)" if r.util_s >= UTIL_MIN_S else
                 f" (too idle to grow past once so for {age(UTIL_MIN_S)}: {age(r.util_s)} so far)")
    return line


def quota_defaults(needed_above: int) -> str:
    """What applies where no quota is set, as the controller says (``SettingsReply
    .quota_needed_above``; -1: not said): said by every quota listing, so nobody reads an empty
    table as "no limits"."""
    above = [p.name for p in sorted(Priority) if p.value > needed_above]
    if needed_above < 0 or not above:
        return "defaults: without a quota, every level has no limit"
    return (f"defaults: without a quota, {Priority.label(needed_above)} and lower have no limit; "
            f"{', '.join(above)} are closed (0 nodes) to all but operators' jobs. An operator opens a level "
            "with `hfai quota set USER LEVEL N` ('*' as USER: everyone).")


def totals(rows: Iterable[UsageRow], by: str) -> dict[str, float]:
    """GPU-hours per value of one column of the rows (``user``, ``group``, ``priority`` or ``day``)."""
    out: dict[str, float] = {}
    for r in rows:
        key = str(getattr(r, by))
        out[key] = out.get(key, 0.0) + r.gpu_hours
    return out


CSV_HEADER = ("day", "user", "group", "priority", "gpu_hours", "runs")


def csv_lines(rows: Iterable[UsageRow]) -> list[str]:
    """The rows as CSV lines (header first); names are tokens, so nothing needs quoting."""
    return [",".join(CSV_HEADER)] + [
        f"{r.day},{r.user},{r.group},{Priority.label(r.priority)},{r.gpu_hours:.3f},{r.runs}" for r in rows]
