"""``hfai sim``: replay a job trace through the scheduling policy, or generate a synthetic trace.

    hfai sim TRACE.csv --nodes 1250 [--policy hfai --policy fifo ...] [--slice 1800] [--plot out.png]
    hfai sim gen OUT.csv --jobs 20000 --nodes 1250 --load 1.2 --seed 0

``hfai sim TRACE.csv ...`` is short for ``hfai sim run TRACE.csv ...``. Light to import: the
simulator is loaded inside the commands; torch is never imported. User mistakes (missing file,
bad CSV row, a job larger than the cluster) end in a one-line error and exit status 1.
"""

from __future__ import annotations

import click

from hfai.cli.errors import user_errors
from hfai.protocol.limits import MAX_NODES

#: A generated trace is built in memory: ten million jobs is far past any replay worth waiting for.
MAX_TRACE_JOBS = 10_000_000

POLICY_NAMES = ("hfai", "hfai-gain", "fifo", "las", "las-prio")
#: Replayed when no --policy is given (las-prio is LAS honouring priorities: ask for it).
DEFAULT_POLICIES = ("hfai", "fifo", "las")


def _sim_errors() -> tuple[type[BaseException], ...]:
    from hfai.protocol.errors import HfaiError

    return (HfaiError, OSError)


#: Errors a user can cause become ``Error: ...`` on one line, not a traceback (hfai.cli.errors).
_user_errors = user_errors(_sim_errors)


class _SimGroup(click.Group):
    """A group whose default command is ``run``: ``hfai sim TRACE.csv`` needs no ``run``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group("sim", cls=_SimGroup)
def sim() -> None:
    """Replay a job trace in virtual time through the live scheduling policy and baselines.

    \b
    hfai sim TRACE.csv --nodes N      replay (same as: hfai sim run TRACE.csv ...)
    hfai sim gen OUT.csv --jobs N ... write a synthetic trace

    Trace CSV columns: submit_s,duration_s,nodes,priority,user (the last two optional; nodes is
    N or MIN:MAX for an elastic job). See docs/scheduling.md.
    """


#: What the columns of the table mean: printed under it and in ``hfai sim run --help``.
COLUMNS = (
    "util: busy node-time / capacity while some job waits (checkpoints and restarts count as busy); "
    "ovh: share of busy time spent checkpointing and restarting; JCT: job completion time, submit to "
    "end; avg queue: submit to first start; intr/job: interrupts (preemptions, time slices, resizes) "
    "per job; fairness: Jain's index over users of (their jobs' run time / their jobs' JCT): 1 when "
    "every user's jobs were slowed alike, towards 1/users when one user's jobs got everything."
)


@sim.command("run", epilog=f"Columns: {COLUMNS}")
@click.argument("trace", type=click.Path(dir_okay=False))
@click.option("--nodes", "n_nodes", type=click.IntRange(1, MAX_NODES), required=True,
              help="Nodes in the simulated cluster.")
@click.option("--policy", "policies", type=click.Choice(POLICY_NAMES), multiple=True,
              help="Policy to replay; repeat for several. Default: hfai, fifo and las.")
@click.option("--slice", "slice_s", type=click.FloatRange(min=0), default=1800.0, show_default=True,
              help="Time slice in seconds (hfai).")
@click.option("--checkpoint-s", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds a suspended job takes to checkpoint and release its nodes.")
@click.option("--restart-s", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="Seconds a resumed job takes to restore before it makes progress.")
@click.option("--tick-s", type=click.FloatRange(min=0.001), default=1.0, show_default=True,
              help="Scheduling period of the simulated controller.")
@click.option("--above-normal-s", type=click.FloatRange(min=0), default=None,
              help="Run time after which ABOVE_NORMAL counts as NORMAL (hfai; default: never).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Draw utilisation and queue length over time into this PNG (needs matplotlib).")
@_user_errors
def run(trace: str, n_nodes: int, policies: tuple[str, ...], slice_s: float, checkpoint_s: float,
        restart_s: float, tick_s: float, above_normal_s: float | None, plot: str | None) -> None:
    """Replay TRACE (CSV) on a cluster of --nodes nodes and print one table."""
    import math

    from hfai import sim as simulator
    from hfai.controller.policy import PolicyConfig

    if plot:
        _check_plot_path(plot)
        _check_matplotlib()
    jobs = simulator.read_trace(trace)
    policy = PolicyConfig(slice_s=slice_s, above_normal_s=math.inf if above_normal_s is None else above_normal_s)
    config = simulator.SimConfig(checkpoint_s=checkpoint_s, restart_s=restart_s, tick_s=tick_s, policy=policy)
    results = [simulator.simulate(jobs, n_nodes, name, config, record=bool(plot))
               for name in policies or DEFAULT_POLICIES]
    click.echo(f"{len(jobs)} jobs on {n_nodes} nodes; checkpoint {checkpoint_s:g}s, restart {restart_s:g}s, "
               f"slice {slice_s:g}s")
    click.echo(simulator.format_table(results))
    click.echo(click.wrap_text(COLUMNS, width=100))
    if plot:
        simulator.plot(results, plot)
        click.echo(f"plot written to {plot}")


def _check_plot_path(path: str) -> None:
    """Fail before a long replay if the plot cannot be written where asked: try it (permission
    bits say nothing to root, nor about a read-only file system)."""
    import os

    try:
        if os.path.exists(path):
            with open(path, "ab"):
                pass
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.unlink(path)
    except OSError as e:
        raise click.ClickException(f"cannot write the plot to {path}: {e.strerror or e}") from None


def _check_matplotlib() -> None:
    """Fail before a long replay, not after it."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib, which is not installed: pip install matplotlib")


@sim.command("gen")
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--jobs", type=click.IntRange(1, MAX_TRACE_JOBS), required=True, help="Number of jobs.")
@click.option("--nodes", "n_nodes", type=click.IntRange(1, MAX_NODES), required=True,
              help="Cluster size the load refers to.")
@click.option("--load", type=click.FloatRange(min=0, min_open=True), default=1.2, show_default=True,
              help="Offered load: the trace's demand / capacity over its arrival span (arrivals are "
                   "stretched to give exactly this).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--users", type=click.IntRange(1, MAX_TRACE_JOBS), default=8, show_default=True)
@click.option("--elastic", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Fraction of multi-node jobs that are elastic (MIN:MAX nodes).")
@_user_errors
def gen(out: str, jobs: int, n_nodes: int, load: float, seed: int, users: int, elastic: float) -> None:
    """Write a synthetic trace to OUT: Poisson arrivals, heavy-tailed durations, 1-64 nodes."""
    from hfai import sim as simulator
    from hfai.sim import tracegen

    trace = tracegen.generate(jobs, n_nodes, load=load, seed=seed, users=users, elastic=elastic)
    simulator.write_trace(out, trace)
    click.echo(f"{out}: {len(trace)} jobs over {trace[-1].submit_s / 86400:.2f} days, "
               f"offered load {tracegen.offered_load(trace, n_nodes):.2f} on {n_nodes} nodes")
