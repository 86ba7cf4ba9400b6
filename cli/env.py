"""``hfai env``: the cluster's base environments and your own, usable as ``HF_ENV_NAME=<name> hfai python ...``
on every node."""

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
    """The cluster's base environments and your own virtualenvs (the original's haienv)."""


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
    """The environments jobs may use: the cluster's base environments, then yours."""
    from hfai import base_envs
    from hfai.storage import envs

    root = _root()
    base = base_envs.load(root)
    me = _me()[0]
    found = envs.listing(root)
    if not base and not found:
        click.echo(f"no environments (in {root}); make one with: hfai env create NAME")
        return
    if base:
        click.echo("base environments (read-only, for everyone):")
        click.echo(f"  {'NAME':<16} {'PYTHON':<8} {'ALIASES':<24} PACKAGES")
        for b in base:
            main = [k for k in base_envs.MAIN_PACKAGES if k in b.packages]
            order = main + sorted(set(b.packages) - set(main))
            packages = ", ".join(f"{k} {b.packages[k]}" for k in order) or "-"
            click.echo(f"  {b.name:<16} {b.python:<8} {', '.join(b.aliases) or '-':<24} {packages}")
    mine = [e for e in found if e.owner == me]
    others = [e for e in found if e.owner != me]
    for title, rows in (("your environments", mine), ("other users' environments", others)):
        if not rows and title != "your environments":
            continue
        click.echo(f"{title}:" if rows else f"{title}: none (make one with: hfai env create NAME)")
        if rows:
            click.echo(f"  {'NAME':<20} {'OWNER':<12} {'PYTHON':<10} PATH")
        for e in rows:
            click.echo(f"  {e.name:<20} {e.owner:<12} {e.python:<10} {e.path}")


@env.command("remove")
@click.argument("name")
@user_errors()
def remove(name: str):
    """Delete your environment NAME."""
    from hfai.storage import envs

    user, operator = _me()
    e = envs.remove(_root(), name, user, operator)
    click.echo(f"removed environment {e.name}")


@env.group("base")
def base():
    """The cluster's base environments: interpreters with the stock packages (operators)."""


@base.command("add")
@click.argument("name")
@click.argument("path")
@click.option("--alias", "aliases", multiple=True, metavar="A",
              help="Another name jobs may ask for it by (a stock name such as py38-202111 or 202111); repeatable.")
@user_errors()
def base_add(name: str, path: str, aliases: tuple[str, ...]):
    """Offer the interpreter at PATH (a prefix, or the python itself) as base environment NAME
    (py<major><minor>-<YYYYMM>). Operators only; NAME already there is replaced."""
    from hfai.storage import envs

    user, operator = _me()
    b = envs.add_base(_root(), name, path, aliases, operator=operator, user=user)
    click.echo(f"base environment {b.label}: Python {b.python} at {b.path}; use it with HF_ENV_NAME={b.name}")


@base.command("remove")
@click.argument("name")
@user_errors()
def base_remove(name: str):
    """Stop offering base environment NAME (its interpreter stays). Operators only."""
    from hfai.storage import envs

    user, operator = _me()
    b = envs.remove_base(_root(), name, operator=operator, user=user)
    click.echo(f"removed base environment {b.label} (its interpreter at {b.path} stays)")
