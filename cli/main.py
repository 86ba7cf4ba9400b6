"""The ``hfai`` command: the group, and where each of its commands lives.

Light on purpose: every command's module is imported only when that command runs (or its help is
shown), so ``hfai --help`` never imports torch, nor nats. User mistakes end with one line on
stderr and a non-zero exit, not a traceback (hfai.cli.errors).

    cli/submit.py     hfai submit, hfai python
    cli/jobs.py       hfai ps, status, stop, nodes, logs
    cli/control.py    hfai hold, release, requeue, update, estimate
    cli/admin.py      hfai admin (credentials), quota, node, and the daemons: controller, agent
    cli/local_commands.py   hfai local
    cli/<group>.py    hfai data, sim, usage, workspace, dataset, env
"""

from __future__ import annotations

import importlib

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
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx, name):
        if name in LAZY_COMMANDS:
            module, attr = LAZY_COMMANDS[name]
            try:
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
