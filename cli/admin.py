"""``hfai admin``: issue and revoke credentials (operators, on the host that holds the issuer keys).

Adding a user needs nothing from the servers: the new JWT is signed by the account they already
trust. Removing one revokes the key in the account JWT and pushes that to the running servers,
which close the user's connections and refuse the key from then on.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import click

from hfai.cli.errors import user_errors

DEFAULT_ISSUER = Path("/etc/hfai/issuer")


def issuer_dir() -> Path:
    """``$HFAI_ISSUER`` if set, else a running local cluster's, else /etc/hfai/issuer."""
    from hfai.cli.local import LocalCluster

    if os.environ.get("HFAI_ISSUER"):
        return Path(os.environ["HFAI_ISSUER"])
    local = LocalCluster.load()
    if local is not None and local.auth:
        return local.root / "auth"
    return DEFAULT_ISSUER


def _issuer(create: bool = False):
    from hfai.auth.issuer import Issuer

    return Issuer.open(issuer_dir(), create=create)


def _creds_dir() -> Path:
    from hfai.cli.client import creds_dir
    from hfai.cli.main import cli_config

    return creds_dir(cli_config())


@click.group()
def admin():
    """Operators: issue and revoke credentials (needs the issuer keys: $HFAI_ISSUER)."""


@admin.command("init")
@click.argument("directory", type=click.Path(path_type=Path))
def init(directory: Path):
    """Make a new issuer (the keys that sign every credential) in DIRECTORY."""
    from hfai.auth.issuer import Issuer

    if (directory / "operator.seed").exists():
        raise click.ClickException(f"{directory} already holds an issuer")
    Issuer.open(directory, create=True)
    click.echo(f"issuer keys in {directory} (keep it root-only, off the GPU nodes); "
               f"next: HFAI_ISSUER={directory} hfai admin server-config")


@admin.command("server-config")
@click.option("--resolver-dir", default="/var/lib/nats/accounts", show_default=True,
              help="Where each nats-server keeps account JWTs.")
@user_errors()
def server_config(resolver_dir: str):
    """Print the nats-server config block that trusts this issuer's credentials."""
    click.echo(_issuer().server_config(resolver_dir), nl=False)


@admin.group()
def user():
    """Users' credentials."""


@user.command("add")
@click.argument("name")
@click.option("--operator", is_flag=True, help="May set quotas, drain nodes, and act on others' jobs.")
@click.option("--role", type=click.Choice(["user", "operator", "agent", "controller"]), default=None,
              help="For daemons: agent (NAME is the node) or controller.")
@click.option("-o", "--out", type=click.Path(path_type=Path),
              help="Credentials file (default: <creds dir>/NAME.creds).")
@user_errors()
def user_add(name: str, operator: bool, role: str | None, out: Path | None):
    """Issue credentials for NAME (a file only its owner may read; hand it to that user)."""
    from hfai.auth.issuer import write_secret
    from hfai.auth.roles import Role

    chosen = Role(role) if role else (Role.OPERATOR if operator else Role.USER)
    creds = _issuer().issue(name, chosen)
    out = out or _creds_dir() / f"{name}.creds"
    write_secret(out, creds)
    click.echo(f"issued {chosen.value} credentials for {name}: {out} (mode 0600)")
    if chosen in (Role.USER, Role.OPERATOR) and out.parent != _creds_dir():
        click.echo(f"  {name}'s CLI presents it from $HFAI_HOME/creds/{name}.creds (default ~/.hfai/creds/)")


@user.command("list")
@user_errors()
def user_list():
    """Everyone holding credentials, with role and when issued."""
    from hfai.cli import render

    issuer = _issuer()
    holders, revoked = issuer.holders(), issuer.revocations()
    if not holders:
        click.echo(f"no credentials issued ({len(revoked)} revoked keys); issue some with: hfai admin user add NAME")
        return
    click.echo(f"{'NAME':<24} {'ROLE':<11} ISSUED")
    for h in holders:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(h.issued_ts))
        click.echo(f"{render.clean(h.name):<24} {h.role.value:<11} {when}")
    click.echo(f"({len(holders)} holders, {len(revoked)} revoked keys)")


@user.command("remove")
@click.argument("name")
@user_errors()
def user_remove(name: str):
    """Revoke NAME's credentials on the running cluster (no restart)."""
    from hfai.auth.push import push_account
    from hfai.cli.main import cli_config

    held = _issuer().revoke(name)
    asyncio.run(push_account(_issuer(), cli_config()))
    click.echo(f"revoked {held.role.value} credentials of {name}; the cluster refuses them from now on")
