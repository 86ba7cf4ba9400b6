"""The ``hfai`` command: the group, and where each of its commands lives.

Light on purpose: every command's module is imported only when that command runs (or its own help
is shown); ``hfai --help`` lists the commands from :data:`SUMMARIES` and imports none of them (no
protocol, asyncio, nats or torch: a third of its time otherwise). User mistakes end with one line on
stderr and a non-zero exit, not a traceback (hfai.cli.errors).

    cli/submit.py     hfai submit, hfai python
    cli/jobs.py       hfai ps, status, stop, nodes, logs
    cli/control.py    hfai hold, release, requeue, update, estimate
    cli/exec.py       hfai exec, shell
    cli/admin.py      hfai admin (credentials), quota, node, and the daemons: controller, agent
    cli/local_commands.py   hfai local
    cli/<group>.py    hfai data, sim, usage, workspace, dataset, env, dev
"""

from __future__ import annotations

import atexit
import gc
import importlib
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

#: command name -> (module, attribute): each defined in its own module, imported only when used.
LAZY_COMMANDS = {
    # Submitting (cli/submit.py).
    "python": ("hfai.cli.submit", "python_cmd"),
    "submit": ("hfai.cli.submit", "submit"),
    # Asking about jobs and nodes (cli/jobs.py).
    "ps": ("hfai.cli.jobs", "ps"),
    "status": ("hfai.cli.jobs", "status"),
    "stop": ("hfai.cli.jobs", "stop"),
    "nodes": ("hfai.cli.jobs", "nodes"),
    "logs": ("hfai.cli.jobs", "logs"),
    # Commands inside a running job (cli/exec.py).
    "exec": ("hfai.cli.exec", "exec_cmd"),
    "shell": ("hfai.cli.exec", "shell"),
    # Changing jobs after submit (cli/control.py).
    "hold": ("hfai.cli.control", "hold"),
    "release": ("hfai.cli.control", "release"),
    "requeue": ("hfai.cli.control", "requeue"),
    "update": ("hfai.cli.control", "update"),
    "estimate": ("hfai.cli.control", "estimate"),
    # Running the cluster (cli/admin.py).
    "admin": ("hfai.cli.admin", "admin"),
    "quota": ("hfai.cli.admin", "quota"),
    "node": ("hfai.cli.admin", "node"),
    "controller": ("hfai.cli.admin", "controller"),
    "agent": ("hfai.cli.admin", "agent"),
    "local": ("hfai.cli.local_commands", "local"),
    # Groups of their own.
    "data": ("hfai.cli.data", "data"),
    "sim": ("hfai.cli.sim", "sim"),
    "usage": ("hfai.cli.usage", "usage"),
    "workspace": ("hfai.cli.workspace", "workspace"),
    "dataset": ("hfai.cli.dataset", "dataset"),
    "env": ("hfai.cli.env", "env"),
    "dev": ("hfai.cli.dev", "dev"),
}

#: command name -> the first sentence of its help, which ``hfai --help`` shortens to the terminal's
#: width as click does (tests/test_cli_latency.py checks each against the command's own help).
SUMMARIES = {
    "python": "Run FILE with python: on the cluster if hfai options follow `--`, else here.",
    "submit": "Submit any COMMAND (python file.py ..., bash file.sh, an executable) as a job.",
    "ps": "List jobs (the active ones, by default everyone's): id, name, user, nodes (an elastic job: held of "
          "MIN-MAX), priority, state, suspend count, age, why.",
    "status": "Show one job (by id or name): state, why, nodes, run time, hold, dependencies, limits, history.",
    "stop": "Stop jobs (each by id or name, or a whole job array by its id or name): waiting jobs at once, running "
            "ones through their nodes' agents.",
    "nodes": "Nodes: state, GPUs busy, utilisation, memory, jobs, and why a node is drained or down (a down node's "
             "figures, in parentheses, are from its last heartbeat).",
    "logs": "Print a job's output (stdout and stderr of one rank, all its runs).",
    "exec": "Run COMMAND in the running JOB's environment and workdir, as its user, on the node of RANK.",
    "shell": "An interactive shell (or COMMAND) under a terminal in the running JOB, on the node of RANK.",
    "hold": "Keep waiting JOBs (ids or names; a job array by its id or name: its waiting members) from starting "
            "until `hfai release`.",
    "release": "Let held JOBs (or a job array's held members) start again (they keep their place in line).",
    "requeue": "Interrupt a running JOB like a preemption (it checkpoints) and put it back in line.",
    "update": "Change waiting JOBs' priority or node count (checked like a new submission); a job array (its id or "
              "name): its waiting members.",
    "estimate": "When the waiting jobs would start if every job ran exactly its time limit (-t) and nothing new "
                "arrived: a forward replay of the live policy (priorities, slices, holds, dependencies).",
    "admin": "Operators: issue and revoke credentials (needs the issuer keys: $HFAI_ISSUER), check nodes' GPU health.",
    "quota": "Node quotas per (user, priority, group).",
    "node": "Take nodes out of service and back (operators).",
    "controller": "Run a controller replica (same as `hfai-controller`): it serves the API, and schedules while it "
                  "holds the lease.",
    "agent": "Run this node's agent (same as `hfai-agent`): it runs the jobs the leader assigns to the node ([agent] "
             "node, default the host name) and reports them.",
    "local": "A whole cluster on this machine: NATS, a controller, N agents with simulated GPUs.",
    "data": "Pack, inspect, verify and convert ffrecord datasets (.ffr files and directories of them).",
    "sim": "Replay a job trace in virtual time through the live scheduling policy and baselines.",
    "usage": "GPU-hours per day, user, group and priority (everyone's, like the queue).",
    "workspace": "Sync a project directory to the cluster; jobs submitted from it run in the cluster's copy.",
    "dataset": "Public and group-private datasets, read-only to jobs.",
    "env": "The cluster's base environments and your own virtualenvs (the original's haienv).",
    "dev": "Development sessions: JupyterLab on the cluster, opened through hfai-web.",
}


#: Whether _loading froze what the imports made (undone when the command ends: see LazyGroup.main).
_frozen = False


@contextmanager
def _loading(module: str) -> Iterator[None]:
    """While a command's module and what it needs load for the first time (asyncio, nats-py, the
    protocol: most of a call's time), the cyclic garbage collector is paused: it would run some
    20 times and find nothing to free, since what a module makes lives as long as the process.
    What exists then is frozen (gc.freeze), so that the command's own collections do not go
    through it; LazyGroup.main thaws it when the command ends, so that a process that goes on (a
    test calling the CLI in-process) collects as before. Public gc calls only, and only around
    this import: nothing here depends on how the process was started."""
    global _frozen
    if module in sys.modules or not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        _frozen = True
        gc.enable()


#: Commands that only ask the cluster and print (stdout and stderr are all they write): run as the
#: process's own command (:meth:`LazyGroup.__call__`), they end it at once after the interpreter's
#: exit steps that can matter (see _exit_now), as does a call that ran no command (`hfai --help`,
#: `--version`, a usage error).
QUICK_EXIT = frozenset({"ps", "status", "stop", "nodes", "logs"})


def _exit_now(status: int) -> None:
    """End the process as its exit would, without tearing the interpreter down: the atexit
    handlers run (logging's flush among them), stdout and stderr are flushed, then ``os._exit``.
    What that skips is freeing every object the imports made, one by one, and the final
    collections (docs/performance.md), for memory the process hands back anyway. Where another
    thread still runs (the interpreter would wait for it), a flush fails (the interpreter reports
    it) or this Python has no ``atexit._run_exitfuncs`` (CPython's, undocumented: then the
    handlers could not run; tests/test_cli_startup_adapters.py fails on such a Python), this
    returns and the exit goes on the usual way."""
    import threading

    run_exitfuncs = getattr(atexit, "_run_exitfuncs", None)
    if threading.active_count() > 1 or run_exitfuncs is None:
        return
    run_exitfuncs()  # as the interpreter runs them (and then forgets them)
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except Exception:
        return
    os._exit(status)


class LazyGroup(click.Group):
    """click's group, with each command's module imported when the command runs, and the quick
    exit of a query that is the process's own command."""

    _ran: str | None = None

    def __call__(self, *args, **kwargs):
        """``main()`` without arguments is how the ``hfai`` console script (``sys.exit(main())``)
        and ``python -m hfai.cli.main`` run the command: as the process's own, which ends with it.
        Such a call ends the process at once after a query (:data:`QUICK_EXIT`) or a call that ran
        no command (:func:`_exit_now`); it does not return. A call with arguments, or through
        ``main.main(...)`` (click's CliRunner), returns or raises SystemExit as click's does."""
        if args or kwargs:
            return self.main(*args, **kwargs)
        try:
            return self.main()
        except SystemExit as e:
            status = e.code or 0
            if (self._ran is None or self._ran in QUICK_EXIT) and type(status) is int:
                _exit_now(status)
            raise

    def main(self, *args, **kwargs):
        global _frozen
        try:
            return super().main(*args, **kwargs)
        finally:
            if _frozen:
                gc.unfreeze()
                _frozen = False

    def resolve_command(self, ctx, args):
        name, cmd, rest = super().resolve_command(ctx, args)
        self._ran = cmd.name if cmd is not None else name
        return name, cmd, rest

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def format_commands(self, ctx, formatter):
        """click's listing, from :data:`SUMMARIES` where it has the command (click itself would import
        every command's module for its help); a command without one is imported for it."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(name) for name in names)
        rows = []
        for name in names:
            if name in LAZY_COMMANDS and name in SUMMARIES:
                rows.append((name, click.Command(name, help=SUMMARIES[name]).get_short_help_str(limit)))
                continue
            cmd = self.get_command(ctx, name)
            if cmd is not None and not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            module, attr = LAZY_COMMANDS[name]
            try:
                with _loading(module):
                    mod = importlib.import_module(module)
            except ImportError:
                return None
            found = getattr(mod, attr, None)
            if not isinstance(found, click.Command):
                found = next((v for v in vars(mod).values() if isinstance(v, click.Group) and v.name == name), None)
            return found
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="hfai")
def main():
    """hfai: share a GPU cluster by task-level time-sharing.

    \b
    Submit a training script to the cluster:   hfai python train.py -- -n 2 --name mnist -p LOW
    Run the same script locally:               hfai python train.py
    A whole cluster on this machine:           hfai local up --nodes 2
    """


if __name__ == "__main__":
    main()
