"""``hfai env``: your own environments, usable as ``HF_ENV_NAME=<name> hfai python ...`` on every node."""

from __future__ import annotations

import click

from hfai.cli.errors import user_errors


def _root() -> str:
    from hfai.api.config import cli_config

    return cli_config().agent.env_root


def _me() -> tuple[str, bool]:
    """(my hfai user name, operator?) as my credentials say, without connecting."""
    from hfai.api.client import ApiClient
    from hfai.api.config import cli_config

    client = ApiClient(cli_config())
    return client.user, client.operator


@click.group()
def env():
    """Virtualenvs in the nodes' environment root (the original's haienv)."""


@env.command("create")
@click.argument("name")
@click.option("--python", "python", default="", help="Interpreter to base it on (default: this one).")
@click.option("-r", "--requirements", default="", help="pip install -r this file into it.")
@click.option("--system-site-packages", is_flag=True, help="See the base interpreter's packages too.")
@click.option("--no-pip", is_flag=True, help="Without pip (faster; nothing to install into it later).")
@user_errors()
def create(name: str, python: str, requirements: str, system_site_packages: bool, no_pip: bool):
    """Create environment NAME."""
    from hfai.storage import envs

    e = envs.create(_root(), name, python, requirements, system_site_packages, pip=not no_pip, owner=_me()[0])
    click.echo(f"environment {e.name} (Python {e.python}) at {e.path}; use it with HF_ENV_NAME={e.name} or -i {e.name}")


@env.command("list")
@user_errors()
def list_cmd():
    """The environments jobs may use."""
    from hfai.storage import envs

    root = _root()
    found = envs.listing(root)
    if not found:
        click.echo(f"no environments (in {root}); make one with: hfai env create NAME")
        return
    click.echo(f"{'NAME':<20} {'OWNER':<12} {'PYTHON':<10} PATH")
    for e in found:
        click.echo(f"{e.name:<20} {e.owner:<12} {e.python:<10} {e.path}")


@env.command("remove")
@click.argument("name")
@user_errors()
def remove(name: str):
    """Delete your environment NAME."""
    from hfai.storage import envs

    user, operator = _me()
    e = envs.remove(_root(), name, user, operator)
    click.echo(f"removed environment {e.name}")
