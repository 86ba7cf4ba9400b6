"""What the CLI and the web page both show, worded once (the layers: both sit above this one, so
neither imports the other nor the controller for it): the quota defaults' sentence, and usage
reports' totals and CSV."""

from __future__ import annotations

from collections.abc import Iterable

from hfai.protocol.types import Priority, UsageRow

DAY_S = 86400.0


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
