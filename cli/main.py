"""The ``hfai`` command.

Light on purpose: nothing heavy is imported until a command runs (``hfai --help`` never imports
torch, nor nats). User mistakes end with one line on stderr and a non-zero exit, not a traceback.
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import time
from pathlib import Path

import click

from hfai.cli import render
from hfai.cli.errors import user_errors
from hfai.protocol.errors import HfaiError
from hfai.protocol.types import Priority

# Subcommand groups defined in their own modules, imported only when used.
LAZY_GROUPS = {
    "admin": ("hfai.cli.admin", "admin"),
    "data": ("hfai.cli.data", "data"),
    "sim": ("hfai.cli.sim", "sim"),
    "usage": ("hfai.cli.usage", "usage"),
    "workspace": ("hfai.cli.workspace", "workspace"),
    "dataset": ("hfai.cli.dataset", "dataset"),
    "env": ("hfai.cli.env", "env"),
    "local": ("hfai.cli.local_commands", "local"),
    # Changing jobs after submit (cli/control.py).
    "hold": ("hfai.cli.control", "hold"),
    "release": ("hfai.cli.control", "release"),
    "requeue": ("hfai.cli.control", "requeue"),
    "update": ("hfai.cli.control", "update"),
    "estimate": ("hfai.cli.control", "estimate"),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_GROUPS])

    def get_command(self, ctx, name):
        if name in LAZY_GROUPS:
            import importlib

            module, attr = LAZY_GROUPS[name]
            try:
                mod = importlib.import_module(module)
            except ImportError:
                return None
            found = getattr(mod, attr, None)
            if not isinstance(found, click.Command):
                found = next((v for v in vars(mod).values() if isinstance(v, click.Group) and v.name == name), None)
            return found
        return super().get_command(ctx, name)


#: Runs an async command body; typed hfai errors become a clean one-line failure (hfai.cli.errors).
run_async = user_errors()


def cli_config():
    """Config for talking to the cluster (see :func:`hfai.cli.client.cli_config`)."""
    from hfai.cli.client import cli_config as config

    return config()


def api():
    from hfai.cli.client import ApiClient

    return ApiClient(cli_config())


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hfai")
def main():
    """hfai: share a GPU cluster by task-level time-sharing.

    \b
    Submit a training script to the cluster:   hfai python train.py -- -n 2 --name mnist -p LOW
    Run the same script locally:               hfai python train.py
    A whole cluster on this machine:           hfai local up --nodes 2
    """


# -------------------------------------------------------------------------------- submission

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
        click.option("--retry", "retries", type=click.IntRange(0, 100), default=0, show_default=True,
                     help="Requeue a run that fails (a rank's non-zero exit) up to N times."),
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
    if high < low:
        raise click.UsageError(f"-n/--nodes MIN:MAX needs MIN <= MAX, got {text!r}")
    return (high, low, high) if sep and high > low else (high, 0, 0)


def _workdir() -> str:
    """Where the job runs: the cluster's copy when submitted from inside a pushed workspace
    (hfai workspace push), else this directory."""
    from hfai.storage.client import remote_workdir

    cwd = os.getcwd()
    return remote_workdir(Path(cwd)) or cwd


def build_spec(command: list[str], nodes: str, name: str | None, priority: str, group: str,
               env_vars: tuple[str, ...], env_name: str, after: tuple[str, ...] = (), time_limit: str | None = None,
               retries: int = 0, array: str | None = None):
    from hfai.cli.control import parse_array, parse_duration
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
    count, min_nodes, max_nodes = parse_nodes(nodes)
    limit = parse_array(array)[1] if array else 0
    return JobSpec(name=name or entry_script(command)[1], entrypoint=tuple(command), workdir=_workdir(), nodes=count,
                   priority=prio, group=group, env_name=env_name, env=env, min_nodes=min_nodes,
                   max_nodes=max_nodes, after=tuple(after), retries=retries, array_limit=limit,
                   time_limit_s=parse_duration(time_limit) if time_limit else 0.0)


@run_async
async def _submit(spec, force: bool, array: str | None = None) -> None:
    from hfai.cli.control import parse_array
    from hfai.protocol import names
    from hfai.protocol.types import JobReply, SubmitRequest

    indices = parse_array(array)[0] if array else ()
    async with api() as client:
        spec = await _resolve_after(client, spec)
        reply = await client.call(names.VERB_SUBMIT, SubmitRequest(spec=spec, force=force, array=indices), JobReply)
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


# Interpreters whose first operand is a script file: we check it exists before submitting (a
# typo would otherwise surface only on a node) and name the job after it.
_INTERPRETER = re.compile(r"python[0-9.]*|bash|sh")
# Their long options that take the next argument as a value (so that value is not the script).
_LONG_VALUE_OPTIONS = frozenset({"--check-hash-based-pycs", "--rcfile", "--init-file"})


def entry_script(command: list[str] | tuple[str, ...]) -> tuple[str | None, str]:
    """(the script file ``command`` runs, or None; the default job name). Pure.

    ``python -c CODE``, ``bash -c CMD`` and ``python -m MODULE`` run no file: nothing to check,
    and the job is named after the interpreter (or the module). Any other program is named after
    itself; it is looked up on the nodes, not here.
    """
    program = os.path.basename(command[0])
    if not _INTERPRETER.fullmatch(program):
        return None, Path(command[0]).stem
    python = program.startswith("python")
    # Short options that take a value (attached, or the next argument) and those that end the
    # options because the program follows inline (-c) or is a module (-m).
    valued, inline = ("WX", "cm") if python else ("oO", "c")
    rest = iter(command[1:])
    for arg in rest:
        if arg == "--":
            script = next(rest, None)
            return (script, Path(script).stem) if script else (None, program)
        if arg in _LONG_VALUE_OPTIONS:
            next(rest, None)
            continue
        if arg.startswith("--"):
            continue
        if arg[:1] in "-+" and len(arg) > 1:
            for i, flag in enumerate(arg[1:], 1):  # short options may be bundled: -uc CODE, -mpkg.mod
                if flag in valued:
                    if i == len(arg) - 1:
                        next(rest, None)
                    break
                if flag in inline:
                    if flag == "m":
                        module = arg[i + 1:] or next(rest, "")
                        return None, module.rpartition(".")[2] or program
                    return None, program
            continue
        if arg == "-":  # the program comes on stdin
            return None, program
        return arg, Path(arg).stem
    return None, program


def _check_script(command: list[str]) -> None:
    path = entry_script(command)[0]
    if path is not None and not Path(path).is_file():
        raise click.UsageError(f"file {path!r} does not exist (relative to {os.getcwd()})")
    problem = program_problem(command[0])
    if problem:
        raise click.UsageError(f"{problem}: did you mean {_run_hint(command)}?")


#: Script suffixes that are never a program name on PATH (a missing one is a typo).
_SCRIPT_SUFFIXES = (".py", ".sh")


def program_problem(program: str) -> str | None:
    """Why the node could not exec ``program`` (a command's first word) as the submitter means
    it, or None. Checked here because on the node it ends as exit 126/127 in the job's log. A name
    without a '/' is looked up on PATH, never in the working directory; on the nodes PATH may hold
    more (an environment's bin), so only a file of that name here, or a script name, is refused."""
    import shutil

    if _INTERPRETER.fullmatch(os.path.basename(program)):
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


@main.command("python", cls=_PythonCommand,
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
                          p["env_vars"], p["env_name"], p["after"], p["time_limit"], p["retries"], p["array"])
    _submit(spec, p["force"], p["array"])


@click.command()
@submit_options
def _submit_parser(**_kwargs):
    """(parses the hfai options after `--`)"""


@main.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@submit_options
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def submit(command, nodes, name, priority, group, env_vars, env_name, force, after, array, time_limit, retries):
    """Submit any COMMAND (python file.py ..., bash file.sh, an executable) as a job."""
    command = list(command)
    _check_script(command)
    spec = build_spec(command, nodes, name, priority, group, env_vars, env_name, after, time_limit, retries, array)
    _submit(spec, force, array)


# ------------------------------------------------------------------------------------ queries

def _column_help() -> str:
    return "; ".join(f"{name}: {col.help}" for name, col in render.JOB_COLUMNS.items())


json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON (documented in docs/cli.md) instead of a table; nothing cut.")


@main.command(epilog="Filters: --mine / -u with only yourself and which states are asked for (finished or not) are "
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
@json_option
@run_async
async def ps(show_all: bool, mine: bool, users: tuple[str, ...], all_users: bool, states: tuple[str, ...],
             names: tuple[str, ...], held: bool, columns: str | None, wide: bool, sort_by: str | None,
             as_json: bool):
    """List jobs (the active ones, by default everyone's): id, name, user, nodes (an elastic job:
    held of MIN-MAX), priority, state, suspend count, age, why."""
    from hfai.cli.arrays import in_order
    from hfai.cli.client import JobFilter

    shown = render.parse_columns(columns) if columns else render.DEFAULT_COLUMNS
    order = render.parse_sort(sort_by) if sort_by else ()
    client = api()  # who I am comes from the credentials file, before connecting
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
    click.echo(render.jobs_table(jobs, empty=empty, width=None if wide else _terminal_width(), columns=shown))


def _terminal_width() -> int | None:
    """Columns of the terminal the output goes to ($COLUMNS wins), or None for a file or pipe."""
    import shutil

    if os.environ.get("COLUMNS", "").isdigit() or sys.stdout.isatty():
        return shutil.get_terminal_size().columns
    return None


@main.command()
@click.argument("job")
@json_option
@run_async
async def status(job: str, as_json: bool):
    """Show one job (by id or name): state, why, nodes, run time, hold, dependencies, limits, history.
    --json prints one object: a `hfai ps --json` item with its history. A job array (its id or
    name) shows a line about it and its members in index order (--json: an object with them)."""
    from hfai.cli import arrays

    async with api() as client:
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
                       + render.jobs_table(target.jobs, now, width=_terminal_width()))
        return
    record = target.jobs[0]
    click.echo(render.dumps(render.job_json(record, history=True)) if as_json else render.job_details(record))


@main.command()
@click.argument("jobs", nargs=-1, required=True, metavar="JOB...")
@run_async
async def stop(jobs: tuple[str, ...]):
    """Stop jobs (each by id or name, or a whole job array by its id or name): waiting jobs at
    once, running ones through their nodes' agents."""
    from hfai.cli import arrays

    async with api() as client:
        targets = await arrays.resolve(client, jobs)
        await arrays.apply_each(targets, client.stop, "stopped", lambda j: not j.state.final)


@main.command()
@json_option
@run_async
async def nodes(as_json: bool):
    """Nodes: state, GPUs busy, utilisation, memory, jobs, and why a node is drained or down (a down
    node's figures, in parentheses, are from its last heartbeat)."""
    async with api() as client:
        infos, store = await client.nodes_and_store()
    click.echo(render.dumps([render.node_json(n) for n in infos]) if as_json else render.nodes_table(infos))
    alarm = render.store_line(store, time.time())
    if alarm:
        click.echo(alarm, err=as_json)  # JSON readers get the nodes alone on stdout


@main.command()
@click.argument("job")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new output until the job ends.")
@click.option("-r", "--rank", default=0, show_default=True, help="Which node rank's output.")
@click.option("-n", "--tail", type=click.IntRange(min=0), metavar="N",
              help="Only the last N lines (then, with -f, what follows).")
@click.option("-t", "--timestamps", is_flag=True,
              help="Put the time before each line: when this command received it (the nodes keep output "
                   "without times), so for lines already written it is the time you read them.")
@click.option("--poll", default=0.5, hidden=True)
@run_async
async def logs(job: str, follow: bool, rank: int, tail: int | None, timestamps: bool, poll: float):
    """Print a job's output (stdout and stderr of one rank, all its runs)."""
    stamper = render.LineStamper() if timestamps else None
    async with api() as client:
        record = await client.status(job)
        offset: int | None = None
        while True:
            nodes = record.nodes or record.last_nodes
            if rank < 0 or (nodes and rank >= len(nodes)):
                raise click.UsageError(f"job {render.clean(record.id)} has ranks 0..{max(0, len(nodes) - 1)}")
            if nodes:
                if offset is None:
                    offset = 0 if tail is None else await client.tail_offset(record.id, rank, tail)
                async for data in client.read_log(record.id, rank, offset):
                    offset += len(data)
                    sys.stdout.buffer.write(stamper.feed(data, time.time()) if stamper else data)
                    sys.stdout.flush()
            elif not follow:
                click.echo(f"job {render.clean(record.id)} has not run yet ({record.state.value}: "
                           f"{render.clean(record.reason)})", err=True)
            if not follow or record.state.final:
                return
            await asyncio.sleep(poll)
            record = await client.status(record.id)


# ---------------------------------------------------------------------------------- operators

@main.group(invoke_without_command=True)
@json_option
@click.pass_context
def quota(ctx, as_json: bool):
    """Node quotas per (user, priority, group). Alone, as `hfai quota show`: my limits and use.
    Setting them is for operators."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(quota_show, as_json=as_json)


@quota.command("show")
@json_option
@run_async
async def quota_show(as_json: bool = False):
    """My quotas next to my use: per priority and group, the limit that applies to me, the nodes my
    jobs hold, the nodes my waiting jobs ask for, and the room left."""
    from hfai.cli.client import JobFilter

    async with api() as client:
        settings = await client.settings()
        jobs = await client.jobs(JobFilter.of(users=[client.user]))
        groups = {n.record.group for n in await client.nodes()}
        me = client.user
    above = settings.quota_needed_above
    rows = render.quota_use(me, settings.quotas, jobs, groups, above)
    click.echo(render.dumps([r.as_json() for r in rows]) if as_json else render.quota_use_table(me, rows, above))


# ignore_unknown_options: else click takes the documented NODES -1 for an option named "-1".
@quota.command("set", context_settings={"ignore_unknown_options": True})
@click.argument("user")
@click.argument("priority")
@click.argument("nodes", type=click.IntRange(min=-1))
@click.option("-g", "--group", default="*", show_default=True, help="Node group, or * for all.")
@run_async
async def quota_set(user: str, priority: str, nodes: int, group: str):
    """Let USER's jobs of PRIORITY hold at most NODES nodes (USER may be *; NODES -1 removes it)."""
    level = Priority.parse(priority)
    if level not in {p.value for p in Priority}:
        raise click.UsageError("a quota is set for one level, not AUTO: use " + ", ".join(p.name for p in Priority))
    async with api() as client:
        reply = await client.set_quota(user, level, group, nodes)
    click.echo(render.quotas_table(reply.quotas, reply.quota_needed_above))


@quota.command("ls")
@json_option
@run_async
async def quota_ls(as_json: bool):
    """Show every quota."""
    async with api() as client:
        reply = await client.settings()
    click.echo(render.dumps(render.quotas_json(reply.quotas)) if as_json
               else render.quotas_table(reply.quotas, reply.quota_needed_above))


@main.group()
def node():
    """Take nodes out of service and back (operators)."""


@node.command("drain")
@click.argument("name")
@click.option("--reason", default="", help="Shown by `hfai nodes`.")
@run_async
async def node_drain(name: str, reason: str):
    """No new work on node NAME (running jobs finish)."""
    async with api() as client:
        await client.drain(name, True, reason)
    click.echo(f"node {render.clean(name)} drained")


@node.command("undrain")
@click.argument("name")
@run_async
async def node_undrain(name: str):
    """Put node NAME back in service."""
    async with api() as client:
        await client.drain(name, False)
    click.echo(f"node {render.clean(name)} back in service")


# ------------------------------------------------------------------------------------ daemons

def daemon_options(f):
    """--config and --log-level, passed on to the daemon (whose own parser checks them too)."""
    from hfai._daemon import CONFIG_HELP, LOG_LEVEL_HELP, LOG_LEVELS

    f = click.option("--log-level", default="INFO", show_default=True, metavar="LEVEL",
                     type=click.Choice(LOG_LEVELS, case_sensitive=False), help=LOG_LEVEL_HELP)(f)
    return click.option("--config", "config_path", metavar="PATH", help=CONFIG_HELP)(f)


def _daemon_argv(config_path: str | None, log_level: str) -> list[str]:
    return [*(["--config", config_path] if config_path else []), "--log-level", log_level]


@main.command()
@daemon_options
def controller(config_path: str | None, log_level: str):
    """Run a controller replica (same as `hfai-controller`): it serves the API, and schedules
    while it holds the lease. Runs until SIGTERM."""
    from hfai.controller.__main__ import main as run

    sys.exit(run(_daemon_argv(config_path, log_level)))


@main.command()
@daemon_options
def agent(config_path: str | None, log_level: str):
    """Run this node's agent (same as `hfai-agent`): it runs the jobs the leader assigns to the
    node ([agent] node, default the host name) and reports them. Runs until SIGTERM."""
    from hfai.agent.__main__ import main as run

    sys.exit(run(_daemon_argv(config_path, log_level)))


if __name__ == "__main__":
    main()
