"""What the CLI and the web page both show, worded once (the layers: both sit above this one, so
neither imports the other nor the controller for it): text made safe for a terminal, ages, an
elastic job's measured throughput and fitted curve, the quota defaults' sentence, and usage
reports' totals and CSV."""

from __future__ import annotations

import unicodedata
from collections.abc import Iterable

from hfai.protocol.speedup import fit_points
from hfai.protocol.types import JobRecord, Priority, UsageRow

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
    """An elastic job's measured throughput per size, the speedup curve fitted to it, and its
    measured restart cost: what the scheduler sizes it by (docs/scheduling.md)."""
    rates = j.throughput
    if not rates:
        return []
    unit = clean(j.throughput_unit or "steps")
    measured = ", ".join(f"{r.nodes} node{'s' if r.nodes > 1 else ''} {r.rate:.3g}" for r in rates)
    lines = [f"throughput {unit}/s measured: {measured}"]
    if j.spec.elastic:
        curve = fit_points([(r.nodes, r.rate) for r in rates])
        lines.append(f"{'':<11}fitted speedup on 1..{j.spec.max_nodes} nodes: "
                     + " ".join(f"{curve.relative(n):.2f}" for n in range(1, j.spec.max_nodes + 1)))
    restart = float(j.restart_s)
    if restart:
        lines.append(f"{'':<11}a restart costs it {age(restart)} (its latest interruption and start)")
    return lines


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
