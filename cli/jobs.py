"""Asking about jobs and nodes: ``hfai ps``, ``status``, ``stop``, ``nodes`` and ``logs``."""

from __future__ import annotations

import asyncio
import sys
import time

import click

from hfai.cli import common, render
from hfai.protocol.limits import MAX_RANK


def _column_help() -> str:
    return "; ".join(f"{name}: {col.help}" for name, col in render.JOB_COLUMNS.items())


@click.command(epilog="Filters: --mine / -u with only yourself and which states are asked for (finished or not) are "
                     "applied by the controller; other users, states, --name and held are matched by the CLI on "
                     "what it lists.")
@click.option("-a", "--all", "show_all", is_flag=True, help="Include finished jobs.")
@click.option("--mine", is_flag=True, help="Only my jobs (as -u ME).")
@click.option("-u", "--user", "users", multiple=True, metavar="USER", help="Only USER's jobs; repeatable.")
@click.option("--all-users", is_flag=True, help="Everyone's jobs (the default; overrides -u and --mine).")
@click.option("--state", "states", multiple=True, metavar="STATE",
              help=f"Only jobs in STATE ({render.states_help()}, or active: not ended); repeatable. A final "
                   "state implies -a.")
@click.option("--name", "names", multiple=True, metavar="PATTERN",
              help="Only jobs whose name matches the glob PATTERN ('train-*'); repeatable.")
@click.option("--held", is_flag=True, help="Only waiting jobs on hold (hfai hold).")
@click.option("-o", "--columns", metavar="COLUMNS",
              help=f"Comma-separated columns, default {','.join(render.DEFAULT_COLUMNS)}. Known: {_column_help()}.")
@click.option("-w", "--wide", is_flag=True, help="Never cut a cell to fit the terminal.")
@click.option("--sort", "sort_by", metavar="COLUMNS",
              help="Sort by these comma-separated columns, - first for descending ('priority,-age'); default: "
                   f"submit time, a job array's members by index. Sortable: {', '.join(render.SORT_KEYS)}.")
@common.json_option
@common.run_async
async def ps(show_all: bool, mine: bool, users: tuple[str, ...], all_users: bool, states: tuple[str, ...],
             names: tuple[str, ...], held: bool, columns: str | None, wide: bool, sort_by: str | None,
             as_json: bool):
    """List jobs (the active ones, by default everyone's): id, name, user, nodes (an elastic job:
    held of MIN-MAX), priority, state, suspend count, age, why."""
    from hfai.api.arrays import in_order
    from hfai.api.client import JobFilter

    shown = render.parse_columns(columns) if columns else render.DEFAULT_COLUMNS
    order = render.parse_sort(sort_by) if sort_by else ()
    client = common.api()  # who I am comes from the credentials file, before connecting
    who = () if all_users else (*users, *([client.user] if mine else []))
    only = JobFilter.of(users=who, states=states, names=names, finished=show_all)
    async with client:
        jobs = in_order(j for j in await client.jobs(only) if not held or render.held_by(j))
    if order:
        jobs = render.sort_jobs(jobs, order, time.time())
    if as_json:
        now = time.time()
        click.echo(render.dumps([render.job_json(j, now) for j in jobs]))
        return
    filtered = bool(who or states or names or held)
    empty = ("no jobs match" if filtered else "no jobs" if show_all
             else "no active jobs (`hfai ps -a` lists finished ones too)")
    click.echo(render.jobs_table(jobs, empty=empty, width=None if wide else common.terminal_width(), columns=shown))


@click.command()
@click.argument("job")
@common.json_option
@common.run_async
async def status(job: str, as_json: bool):
    """Show one job (by id or name): state, why, nodes, run time, hold, dependencies, limits, history.
    --json prints one object: a `hfai ps --json` item with its history. A job array (its id or
    name) shows a line about it and its members in index order (--json: an object with them)."""
    from hfai.api import arrays

    async with common.api() as client:
        [target] = await arrays.resolve(client, [job])
    if target.is_array:
        now = time.time()
        if as_json:
            first = target.jobs[0]
            members = [render.job_json(j, now) for j in target.jobs]
            click.echo(render.dumps({"array_id": target.array_id, "name": arrays.array_name(first),
                                     "user": first.spec.user, "members": members}))
        else:
            click.echo(render.clean(arrays.summary(target)) + "\n"
                       + render.jobs_table(target.jobs, now, width=common.terminal_width()))
        return
    record = target.jobs[0]
    click.echo(render.dumps(render.job_json(record, history=True)) if as_json else render.job_details(record))


@click.command()
@click.argument("jobs", nargs=-1, required=True, metavar="JOB...")
@common.run_async
async def stop(jobs: tuple[str, ...]):
    """Stop jobs (each by id or name, or a whole job array by its id or name): waiting jobs at
    once, running ones through their nodes' agents."""
    from hfai.api import arrays
    from hfai.cli.arrays import apply_each

    async with common.api() as client:
        targets = await arrays.resolve(client, jobs)
        await apply_each(targets, client.stop, "stopped", lambda j: not j.state.final)


@click.command()
@common.json_option
@common.run_async
async def nodes(as_json: bool):
    """Nodes: state, GPUs busy, utilisation, memory, jobs, and why a node is drained or down (a down
    node's figures, in parentheses, are from its last heartbeat)."""
    async with common.api() as client:
        infos, store = await client.nodes_and_store()
    click.echo(render.dumps([render.node_json(n) for n in infos]) if as_json else render.nodes_table(infos))
    alarm = render.store_line(store, time.time())
    if alarm:
        click.echo(alarm, err=as_json)  # JSON readers get the nodes alone on stdout


@click.command()
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option("-r", "--rank", type=click.IntRange(0, MAX_RANK), default=0, show_default=True,
              help="Which node rank's output.")
@click.option("-n", "--tail", type=click.IntRange(min=0), metavar="N",
              help="Only the last N lines (then, with -f, what follows).")
@click.option("-t", "--timestamps", is_flag=True,
              help="Put the time before each line: when its node read it from the job (where the node "
                   "kept no time for it: when this command received it).")
@click.option("--poll", default=0.5, hidden=True)
@common.run_async
async def logs(job: str, follow: bool, rank: int, tail: int | None, timestamps: bool, poll: float):
    """Print a job's output (stdout and stderr of one rank, all its runs)."""
    stamper = render.LineStamper() if timestamps else None
    async with common.api() as client:
        record = await client.status(job)
        offset: int | None = None
        while True:
            nodes = record.nodes or record.last_nodes
            if rank < 0 or (nodes and rank >= len(nodes)):
                raise click.UsageError(f"job {render.clean(record.id)} has ranks 0..{max(0, len(nodes) - 1)}")
            if nodes:
                if offset is None:
                    offset = 0 if tail is None else await client.tail_offset(record.id, rank, tail)
                async for chunk in client.read_log_chunks(record.id, rank, offset, timestamps=stamper is not None):
                    data = chunk.data
                    offset += len(data)
                    # Each line's time is when its node read it (where the node kept none: when
                    # this command received it).
                    sys.stdout.buffer.write(stamper.feed(data, time.time(), chunk.line_ts) if stamper else data)
                    sys.stdout.flush()
            elif not follow:
                click.echo(f"job {render.clean(record.id)} has not run yet ({record.state.value}: "
                           f"{render.clean(record.reason)})", err=True)
            if not follow or record.state.final:
                return
            await asyncio.sleep(poll)
            record = await client.status(record.id)
