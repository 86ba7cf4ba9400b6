"""Changing jobs after submit: ``hfai hold``, ``release``, ``requeue``, ``update``; and the parsers
of the submission options that need more than click (``--array``, ``--time``). Pure parsers,
thin commands: each command is one API call (controller/api.py), whose rules (own jobs only, the
states each change applies to) are enforced by the controller."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import click

from hfai.api.spec import parse_duration
from hfai.cli import common, render
from hfai.cli.errors import user_errors
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.limits import MAX_ARRAY, MAX_ARRAY_INDEX, MAX_NODES
from hfai.protocol.reasons import describe
from hfai.protocol.types import Priority

if TYPE_CHECKING:
    from hfai.protocol.types import JobReply
    from hfai.protocol.verbs import Verb

run_async = user_errors()

_ARRAY_PART = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


def parse_time(text: str, hint: str = "'-t' / '--time'") -> float:
    """Seconds of a duration option (:func:`hfai.api.spec.parse_duration`). Raises click.BadParameter."""
    try:
        return parse_duration(text)
    except InvalidRequest as e:
        raise click.BadParameter(str(e), param_hint=hint) from None


def parse_array(text: str) -> tuple[tuple[int, ...], int]:
    """(indices, limit) from ``0-99``, ``1,3,5``, ``0-15:4`` (a step), each with an optional
    ``%N``: at most N members hold nodes at once (0: no limit). Raises click.BadParameter."""
    spec, _, limit_text = text.strip().partition("%")
    hint = "'--array'"
    try:
        limit = int(limit_text) if limit_text else 0
    except ValueError:
        raise click.BadParameter(f"{text!r}: %N needs a whole number", param_hint=hint) from None
    if limit_text and not 1 <= limit <= MAX_ARRAY:
        raise click.BadParameter(f"%N must be 1 to {MAX_ARRAY} (an array's most members), not {limit}",
                                 param_hint=hint)
    indices: list[int] = []
    for part in spec.split(","):
        m = _ARRAY_PART.fullmatch(part.strip())
        if not m:
            raise click.BadParameter(f"{text!r}: expected 0-99, 1,3,5 or 0-15:4, with an optional %N",
                                     param_hint=hint)
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi > MAX_ARRAY_INDEX:
            raise click.BadParameter(f"indices go from 0 to {MAX_ARRAY_INDEX}, not {hi}", param_hint=hint)
        if hi < lo or step < 1:
            raise click.BadParameter(f"{text!r}: a range needs FIRST <= LAST and a step of at least 1",
                                     param_hint=hint)
        if (hi - lo) // step + 1 + len(indices) > MAX_ARRAY:
            raise click.BadParameter(f"{text!r}: at most {MAX_ARRAY} members", param_hint=hint)
        indices.extend(range(lo, hi + 1, step))
    if len(set(indices)) != len(indices):
        raise click.BadParameter(f"{text!r}: an index is given twice", param_hint=hint)
    return tuple(indices), limit


def _show(job, what: str) -> None:
    click.echo(f"job {render.clean(job.spec.name)} ({render.clean(job.id)}) {what}: {render.clean(job.state.value)}"
               + (f", {render.clean(describe(job))}" if job.reason else ""))


async def _call(verb: Verb[Any, JobReply], request):
    async with common.api() as client:
        return (await client.call(verb, request)).job


async def _each(refs: tuple[str, ...], verb: Verb[Any, JobReply], request, what: str, applies) -> None:
    """``verb`` with ``request(job id)`` for each job REFS mean (a job array: its members for which
    ``applies`` holds), one connection for all (cli/arrays.py)."""
    from hfai.api import arrays
    from hfai.cli.arrays import apply_each

    async with common.api() as client:
        targets = await arrays.resolve(client, refs)

        async def act(job_id: str):
            return (await client.call(verb, request(job_id))).job

        await apply_each(targets, act, what, applies)


@click.command()
@click.argument("jobs", nargs=-1, required=True, metavar="JOB...")
@run_async
async def hold(jobs: tuple[str, ...]):
    """Keep waiting JOBs (ids or names; a job array by its id or name: its waiting members) from
    starting until `hfai release`."""
    from hfai.protocol import verbs
    from hfai.protocol.types import HoldRequest

    await _each(jobs, verbs.HOLD, lambda j: HoldRequest(job=j, hold=True), "held", lambda j: j.state.waiting)


@click.command()
@click.argument("jobs", nargs=-1, required=True, metavar="JOB...")
@run_async
async def release(jobs: tuple[str, ...]):
    """Let held JOBs (or a job array's held members) start again (they keep their place in line)."""
    from hfai.protocol import verbs
    from hfai.protocol.types import HoldRequest

    await _each(jobs, verbs.HOLD, lambda j: HoldRequest(job=j, hold=False), "released",
                lambda j: j.state.waiting and bool(render.held_by(j)))


@click.command()
@click.argument("job")
@run_async
async def requeue(job: str):
    """Interrupt a running JOB like a preemption (it checkpoints) and put it back in line."""
    from hfai.protocol import verbs
    from hfai.protocol.types import RequeueRequest

    _show(await _call(verbs.REQUEUE, RequeueRequest(job=job)), "requeued")


@click.command()
@click.argument("jobs", nargs=-1, required=True, metavar="JOB...")
@click.option("-p", "--priority", help=f"New priority: {Priority.choices()}.")
@click.option("-n", "--nodes", type=click.IntRange(1, MAX_NODES), help="New node count (not for elastic jobs).")
@run_async
async def update(jobs: tuple[str, ...], priority: str | None, nodes: int | None):
    """Change waiting JOBs' priority or node count (checked like a new submission); a job array
    (its id or name): its waiting members."""
    from hfai.protocol import verbs
    from hfai.protocol.errors import HfaiError
    from hfai.protocol.types import UpdateRequest

    if priority is None and nodes is None:
        raise click.UsageError("give -p/--priority and/or -n/--nodes")
    try:
        level = Priority.parse(priority) if priority is not None else None
    except HfaiError as e:
        raise click.UsageError(str(e)) from None
    await _each(jobs, verbs.UPDATE, lambda j: UpdateRequest(job=j, priority=level, nodes=nodes), "changed",
                lambda j: j.state.waiting)


def _in(seconds: float) -> str:
    s = max(0.0, seconds)
    if s < 90:
        return "now" if s < 1 else f"in ~{s:.0f}s"
    if s < 5400:
        return f"in ~{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"in ~{s / 3600:.1f} h"
    return f"in ~{s / 86400:.1f} d"


@click.command()
@click.option("--assume", "assume", metavar="DURATION",
              help="How long a job without a time limit (-t) runs (default: a guess from the cluster's history; "
                   "'forever': jobs behind it get none).")
@click.option("--json", "as_json", is_flag=True,
              help="One object per waiting job: id, name, user, start (or null), guess (the start rests on a guess).")
@run_async
async def estimate(assume: str | None, as_json: bool):
    """When the waiting jobs would start if every job ran exactly its time limit (-t) and nothing
    new arrived: a forward replay of the live policy (priorities, slices, holds, dependencies).
    A job without a time limit is guessed to run as long as the jobs that finished here (the
    median), or as long again as it has run already: such estimates are marked as guesses."""
    from hfai.protocol import verbs
    from hfai.protocol.types import EstimateRequest, ListRequest

    forever = assume is not None and assume.strip().lower() == "forever"
    default = parse_time(assume) if assume and not forever else 0.0
    async with common.api() as client:
        reply = await client.call(verbs.ESTIMATE, EstimateRequest(default_run_s=default, guess=assume is None))
        jobs = await client.list(request=ListRequest(include_finished=False, history=0))
    waiting = [j for j in jobs if j.state.waiting]
    # A start rests on the guess when some job without a time limit is ahead of it or is it.
    unlimited = any(j.spec.time_limit_s <= 0 for j in jobs if not j.state.final)
    guessed = reply.guessed_run_s > 0 and unlimited
    if as_json:
        click.echo(render.dumps([{"id": j.id, "name": j.spec.name, "user": j.spec.user,
                                  "start": reply.starts.get(j.id), "guess": guessed and j.id in reply.starts}
                                 for j in waiting]))
        return
    if not waiting:
        click.echo("no job is waiting")
        return
    mark = "guess: " if guessed else ""
    rows = [[render.clean(j.id), render.clean(j.spec.name), render.clean(j.spec.user), Priority.label(j.spec.priority),
             mark + _in(reply.starts[j.id] - reply.now) if j.id in reply.starts else "-"] for j in waiting]
    click.echo(render.table_text(["ID", "NAME", "USER", "PRIORITY", "STARTS"], rows))
    if guessed:
        click.echo(f"guess: jobs without a time limit (-t) are taken to run {render.age(reply.guessed_run_s)} "
                   "(the median of the jobs that finished here; 1h before any has), or as long again as they have "
                   "run already; --assume DURATION says how long instead")
    if len(reply.starts) < len(waiting):
        click.echo("-: no estimate (a job ahead runs without a time limit; see --assume)")
