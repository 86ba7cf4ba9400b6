"""Job arrays in the CLI: one line per job an action applies to (the lookup itself, shared with the
web page, is hfai.api.arrays)."""

from __future__ import annotations

from collections.abc import Sequence

from hfai.api.arrays import Target, summary
from hfai.protocol.reasons import describe


async def apply_each(targets: Sequence[Target], act, what: str, applies) -> None:
    """``act(job id)`` for every job the targets mean, one line each; an array's members for which
    ``applies(member)`` is false are left as they are (counted on its line). One job's refusal
    does not stop the others: each is said, then a ClickException tells how many failed."""
    import click

    from hfai.cli.render import clean
    from hfai.protocol.errors import HfaiError

    failed = 0
    for t in targets:
        members = [j for j in t.jobs if applies(j)] if t.is_array else list(t.jobs)
        if t.is_array:
            left = len(t.jobs) - len(members)
            click.echo(clean(summary(t)) + (f"; {left} left as they are (not to be {what})" if left else ""))
        ended = [j for j in members if j.state.final] if not t.is_array else []
        for j in ended:  # nothing can change a job that ended: say so rather than echo its state
            failed += 1
            click.echo(f"job {clean(j.spec.name)} ({clean(j.id)}): not {what}: it has already ended "
                       f"({clean(j.state.value)}{', ' + clean(describe(j)) if j.reason else ''})", err=True)
        for j in (j for j in members if j not in ended):
            try:
                done = await act(j.id)
            except HfaiError as e:
                failed += 1
                click.echo(f"job {clean(j.spec.name)} ({clean(j.id)}): not {what}: {clean(str(e))}", err=True)
                continue
            click.echo(f"job {clean(done.spec.name)} ({clean(done.id)}) {what}: {clean(done.state.value)}"
                       + (f", {clean(describe(done))}" if done.reason else ""))
    if failed:
        raise click.ClickException(f"{failed} job(s) not {what} (see above)")
