"""Submitting jobs: ``hfai submit COMMAND`` and ``hfai python FILE [ARGS] -- [OPTIONS]``.

The command is checked here before it is sent (a missing script or a program the nodes could not
exec would otherwise fail only in the job's log); what it runs and how it is named come from
:func:`hfai.api.spec.entry_script`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from hfai.api.spec import INTERPRETER, entry_script
from hfai.cli import common, render
from hfai.protocol.errors import HfaiError
from hfai.protocol.limits import MAX_HANG_RESTARTS, MAX_NODES, MAX_RETRIES
from hfai.protocol.types import Priority


def submit_options(f):
    options = [
        click.option("-n", "--nodes", default="1", show_default=True,
                     help="Whole nodes (8 GPUs each); MIN:MAX for an elastic job."),
        click.option("--name", help="Job name (default: the script's file name)."),
        click.option("-p", "--priority", default="NORMAL", show_default=True,
                     help=f"{Priority.choices()} (the highest level you have quota for)."),
        click.option("-g", "--group", default="default", show_default=True, help="Node group (pool)."),
        click.option("-e", "--env", "env_vars", multiple=True, metavar="K=V", help="Extra environment variable."),
        click.option("-i", "--env-name", default=lambda: os.environ.get("HF_ENV_NAME", ""),
                     help="Environment (HF_ENV_NAME) to run in, from the nodes' environment root."),
        click.option("-f", "--force", is_flag=True, help="Submit even if a job of that name is active."),
        click.option("--after", "after", multiple=True, metavar="JOB[:ok|any]",
                     help="Start only after JOB (an id or a name, as `hfai status` finds it) succeeded (ok, the "
                          "default) or ended at all (any); repeatable."),
        click.option("--array", "array", metavar="SPEC",
                     help="A job array: 0-99, 1,3,5 or 0-15:4 (a step), with %N to run at most N at once; "
                          "each member sees HFAI_ARRAY_INDEX."),
        click.option("-t", "--time", "time_limit", metavar="DURATION",
                     help="Stop the job once it has run this long over all its runs: 90m, 2h, 1:30:00, 45s."),
        click.option("--retry", "retries", type=click.IntRange(0, MAX_RETRIES), default=0, show_default=True,
                     help="Requeue a run that fails (a rank's non-zero exit) up to N times."),
        click.option("--restart-on-hang", "restart_on_hang", type=click.IntRange(0, MAX_HANG_RESTARTS), default=0,
                     show_default=True, metavar="N",
                     help="Requeue a run ended as hung (no output for its watchdog time: hfai.set_watchdog_time, "
                          "HF_WATCHDOG_TIME) up to N times; else it fails."),
    ]
    for opt in reversed(options):
        f = opt(f)
    return f


def parse_nodes(text: str) -> tuple[int, int, int]:
    """(nodes, min_nodes, max_nodes) from "N" or "MIN:MAX" (elastic)."""
    lo, sep, hi = str(text).partition(":")
    try:
        low, high = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise click.UsageError(f"-n/--nodes expects N or MIN:MAX, got {text!r}") from None
    if low < 1:
        raise click.UsageError(f"-n/--nodes must be at least 1, not {low}")
    if high > MAX_NODES:
        raise click.UsageError(f"-n/--nodes takes at most {MAX_NODES} nodes, not {high}")
    if high < low:
        raise click.UsageError(f"-n/--nodes MIN:MAX needs MIN <= MAX, got {text!r}")
    return (high, low, high) if sep and high > low else (high, 0, 0)


def _workdir() -> str:
    """Where the job runs: the cluster's copy when submitted from inside a pushed workspace
    (hfai workspace push), else this directory."""
    from hfai.api.workspace import remote_workdir

    cwd = os.getcwd()
    return remote_workdir(Path(cwd)) or cwd


def build_spec(command: list[str], nodes: str, name: str | None, priority: str, group: str,
               env_vars: tuple[str, ...], env_name: str, after: tuple[str, ...] = (), time_limit: str | None = None,
               retries: int = 0, array: str | None = None, restart_on_hang: int = 0):
    from hfai.cli.control import parse_array, parse_time
    from hfai.protocol.types import JobSpec

    env = {}
    for item in env_vars:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.UsageError(f"-e expects KEY=VALUE, got {item!r}")
        env[key] = value
    try:
        prio = Priority.parse(priority)
    except HfaiError as e:
        raise click.UsageError(str(e)) from None
    if name is not None and not name.strip():
        raise click.UsageError("--name needs a name; leave it out to name the job after its script")
    count, min_nodes, max_nodes = parse_nodes(nodes)
    limit = parse_array(array)[1] if array else 0
    name = entry_script(command)[1] if name is None else name
    return JobSpec(name=name, entrypoint=tuple(command), workdir=_workdir(), nodes=count,
                   priority=prio, group=group, env_name=env_name, env=env, min_nodes=min_nodes,
                   max_nodes=max_nodes, after=tuple(after), retries=retries, array_limit=limit,
                   time_limit_s=parse_time(time_limit) if time_limit else 0.0, restart_on_hang=restart_on_hang)


@common.run_async
async def _submit(spec, force: bool, array: str | None = None) -> None:
    from hfai.cli.control import parse_array
    from hfai.protocol import verbs
    from hfai.protocol.types import SubmitRequest

    indices = parse_array(array)[0] if array else ()
    async with common.api() as client:
        spec = await _resolve_after(client, spec)
        reply = await client.call(verbs.SUBMIT, SubmitRequest(spec=spec, force=force, array=indices))
    job = reply.job
    size = f"{job.spec.min_nodes}-{job.spec.max_nodes}" if job.spec.elastic else str(job.spec.nodes)
    if reply.array_ids:
        at_once = f", at most {spec.array_limit} at once" if spec.array_limit else ""
        click.echo(f"submitted job array {render.clean(spec.name)} ({render.clean(job.spec.array_id)}): "
                   f"{len(reply.array_ids)} jobs {render.clean(spec.name)}[i]{at_once}, {size} node(s) each, "
                   f"priority {Priority.label(job.spec.priority)}")
        click.echo(f"  ids: {' '.join(render.clean(i) for i in reply.array_ids[:10])}"
                   f"{' ...' if len(reply.array_ids) > 10 else ''}")
        return
    click.echo(f"submitted job {render.clean(job.spec.name)} ({render.clean(job.id)}): {size} node(s), "
               f"priority {Priority.label(job.spec.priority)}")
    click.echo(f"  follow it with:  hfai logs {render.clean(job.id)} -f      see the queue with:  hfai ps")


async def _resolve_after(client, spec):
    """``spec`` with each ``--after JOB[:KIND]`` naming its job by id: the controller keeps
    dependencies by id, and a name is found as ``hfai status NAME`` finds it (your own job first;
    the active one, else the newest; two active namesakes are refused)."""
    from dataclasses import replace

    from hfai.protocol.errors import NotFound

    resolved = []
    for entry in spec.after:
        ref, sep, kind = entry.rpartition(":")
        if not sep or kind not in ("ok", "any"):
            ref, kind = entry, ""
        try:
            job = await client.status(ref)
        except NotFound:
            raise NotFound(f"--after {ref}: no job with that id or name (see hfai ps -a)") from None
        resolved.append(f"{job.id}:{kind}" if kind else job.id)
    return replace(spec, after=tuple(resolved)) if resolved else spec


def check_env_name(env_name: str) -> None:
    """One line, before anything is sent, for an environment (HF_ENV_NAME, -i) the cluster has
    none of, naming its base environments and the user's own. Checked here where the environment
    root is mounted (as for `hfai env create`); elsewhere the controller refuses it by what the
    nodes offer."""
    if not env_name:
        return
    from hfai import base_envs
    from hfai.api.config import cli_config

    root = cli_config().agent.env_root
    if not os.path.isdir(root) or base_envs.resolve(root, env_name) is not None:
        return
    from hfai.api.client import ApiClient
    from hfai.storage import envs

    me = ApiClient(cli_config()).user
    mine = {e.name for e in envs.listing(root) if e.owner == me}
    raise click.ClickException(render.clean(f"unknown environment HF_ENV_NAME={env_name!r}; "
                                            f"{base_envs.known(root, mine)} (see hfai env list)"))


def _check_script(command: list[str]) -> None:
    path = entry_script(command)[0]
    if path is not None and not Path(path).is_file():
        raise click.UsageError(f"file {path!r} does not exist (relative to {os.getcwd()})")
    if names_workdir_file(command[0]) and not os.path.lexists(command[0]):
        raise click.UsageError(f"file {command[0]!r} does not exist (relative to {os.getcwd()}, where the job runs)")
    problem = program_problem(command[0])
    if problem:
        raise click.UsageError(f"{problem}: did you mean {_run_hint(command)}?")


def names_workdir_file(program: str) -> bool:
    """Does ``program`` name a file of the directory the job runs in (``./run``, ``bin/train``, an
    absolute path below it)? The job runs in this directory or in the cluster's copy of it, so such
    a file must be here; another absolute path may exist on the nodes alone."""
    if "/" not in program:
        return False  # looked up on PATH
    if not os.path.isabs(program):
        return True
    cwd = os.getcwd()
    return os.path.commonpath([cwd, os.path.abspath(program)]) == cwd


#: Script suffixes that are never a program name on PATH (a missing one is a typo).
_SCRIPT_SUFFIXES = (".py", ".sh")


def program_problem(program: str) -> str | None:
    """Why the node could not exec ``program`` (a command's first word) as the submitter means
    it, or None. Checked here because on the node it ends as exit 126/127 in the job's log. A name
    without a '/' is looked up on PATH, never in the working directory; on the nodes PATH may hold
    more (an environment's bin), so only a file of that name here, or a script name, is refused."""
    import shutil

    if INTERPRETER.fullmatch(os.path.basename(program)):
        return None
    path = Path(program)
    if "/" not in program:
        if shutil.which(program) is not None:
            return None
        if path.is_file():
            return (f"{program!r} is a file here, but a command without a '/' is looked up on PATH, not in "
                    "the working directory")
        if path.suffix in _SCRIPT_SUFFIXES:
            return f"there is no file {program!r} here (in {os.getcwd()}) and no program of that name on PATH"
        return None
    if path.is_file() and not os.access(path, os.X_OK):
        return f"{program!r} is not executable (chmod +x it, or run it with its interpreter)"
    if path.is_dir():
        return f"{program!r} is a directory, not a program"
    return None


def _run_hint(command: list[str]) -> str:
    """The command the user most likely meant, for a script the node could not exec."""
    program, rest = command[0], " ".join(command[1:])
    args = f" {rest}" if rest else ""
    if program.endswith(".py"):
        return f"`hfai python {program}{args} -- -n 1` (or `hfai submit -n 1 python {program}{args}`)"
    if program.endswith(".sh"):
        return f"`hfai submit -n 1 bash {program}{args}`"
    if "/" in program:
        return f"`chmod +x {program}` first, or `hfai submit -n 1 INTERPRETER {program}{args}`"
    return f"`hfai submit -n 1 ./{program}{args}` (an executable file here needs its path)"


class _PythonCommand(click.Command):
    """``hfai python``: its help also lists the submission options that may follow ``--``."""

    def format_options(self, ctx, formatter):
        super().format_options(ctx, formatter)
        sub = click.Context(_submit_parser, info_name="hfai python FILE [ARGS] --")
        skip = _submit_parser.get_help_option(sub)
        rows = [p.get_help_record(sub) for p in _submit_parser.get_params(sub) if p is not skip]
        with formatter.section("Submission options (after `--`; without them FILE runs here)"):
            formatter.write_dl([r for r in rows if r])


@click.command("python", cls=_PythonCommand,
              context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("file", type=str)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def python_cmd(file: str, args: tuple[str, ...]):
    """Run FILE with python: on the cluster if hfai options follow `--`, else here.

    \b
      hfai python train.py --lr 0.1 -- -n 2 --name mnist -p HIGH
      hfai python train.py --lr 0.1           (runs locally)
      hfai python -m pkg.train -- -n 1        (FILE may be -c CODE or -m MODULE too)
    """
    cut = args.index("--") if "--" in args else len(args)
    # FILE may be python's own option (-c CODE, -m MODULE, -u train.py): click leaves those to us.
    argv, hfai_args = [file, *args[:cut]], list(args[cut + 1:])
    _check_script(["python", *argv])
    if cut == len(args):
        os.execv(sys.executable, [sys.executable, *argv])
    ctx = _submit_parser.make_context("hfai python FILE [ARGS] --", hfai_args)
    with ctx:
        p = ctx.params
        spec = build_spec(["python", *argv], p["nodes"], p["name"], p["priority"], p["group"],
                          p["env_vars"], p["env_name"], p["after"], p["time_limit"], p["retries"], p["array"],
                          p["restart_on_hang"])
    check_env_name(spec.env_name)
    _submit(spec, p["force"], p["array"])


@click.command()
@submit_options
def _submit_parser(**_kwargs):
    """(parses the hfai options after `--`)"""


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@submit_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def submit(command, nodes, name, priority, group, env_vars, env_name, force, after, array, time_limit, retries,
           restart_on_hang):
    """Submit any COMMAND (python file.py ..., bash file.sh, an executable) as a job."""
    command = list(command)
    _check_script(command)
    spec = build_spec(command, nodes, name, priority, group, env_vars, env_name, after, time_limit, retries, array,
                      restart_on_hang)
    check_env_name(spec.env_name)
    _submit(spec, force, array)
