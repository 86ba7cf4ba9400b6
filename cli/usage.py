"""``hfai usage``: GPU-hours per UTC day, user, group and priority (sacct-like), as a table or CSV.

The figures come from the controller (``usage`` verb): runs that ended are kept in the bucket
``hfai_usage`` (they outlive purged job records), runs still going count up to now. Same figures
as hfai-web's usage page."""

from __future__ import annotations

import time

import click

from hfai.cli.errors import user_errors


def _table(rows) -> list[str]:
    from hfai.api.present import totals
    from hfai.cli import render
    from hfai.protocol.types import Priority

    head = f"{'DAY':<10}  {'USER':<16}  {'GROUP':<12}  {'PRIORITY':<12}  {'GPU-HOURS':>10}  {'RUNS':>5}"
    lines = [head] + [f"{r.day:<10}  {render.clean(r.user):<16}  {render.clean(r.group):<12}  "
                      f"{Priority.label(r.priority):<12}  {r.gpu_hours:>10.2f}  {r.runs:>5}" for r in rows]
    by_user = totals(rows, "user")
    lines.append(f"total {sum(by_user.values()):.2f} GPU-hours" + (
        " (" + ", ".join(f"{render.clean(u)} {h:.2f}" for u, h in sorted(by_user.items())) + ")" if by_user else ""))
    return lines


@click.command("usage")
@click.option("-d", "--days", default=7, show_default=True, type=click.IntRange(1, 366),
              help="The last DAYS days (UTC days, today included).")
@click.option("--user", "only_user", default="", help="Only this user's rows.")
@click.option("--csv", "as_csv", is_flag=True, help="CSV (day,user,group,priority,gpu_hours,runs) instead of a table.")
@click.option("--json", "as_json", is_flag=True,
              help="JSON: a list of {day, user, group, priority, priority_name, gpu_hours, runs} (docs/cli.md).")
@user_errors()
async def usage(days: int, only_user: str, as_csv: bool, as_json: bool) -> None:
    """GPU-hours per day, user, group and priority (everyone's, like the queue)."""
    from hfai.api.present import DAY_S, csv_lines
    from hfai.cli import common

    since = (time.time() // DAY_S - (days - 1)) * DAY_S  # midnight UTC, `days` days ago
    async with common.api() as client:
        rows = await client.usage(since)
    if only_user:
        rows = tuple(r for r in rows if r.user == only_user)
    if as_json:
        from hfai.cli import render
        from hfai.protocol.types import Priority

        click.echo(render.dumps([{"day": r.day, "user": r.user, "group": r.group, "priority": r.priority,
                                  "priority_name": Priority.label(r.priority), "gpu_hours": r.gpu_hours,
                                  "runs": r.runs} for r in rows]))
        return
    if not rows and not as_csv:  # CSV keeps its header: a program reads it
        click.echo(f"no GPU use recorded in the last {days} day(s)" + (f" by {only_user}" if only_user else ""))
        return
    for line in csv_lines(rows) if as_csv else _table(rows):
        click.echo(line)
