"""Running the cluster: ``hfai admin`` (credentials), ``hfai quota``, ``hfai node drain|undrain``,
and the daemons ``hfai controller`` and ``hfai agent``.

``hfai admin`` issues and revokes credentials (operators, on the host that holds the issuer keys).
Adding a user needs nothing from the servers: the new JWT is signed by the account they already
trust. Removing one revokes the key in the account JWT and pushes that to the running servers,
which close the user's connections and refuse the key from then on.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

import click

from hfai.cli import common, render
from hfai.cli.errors import user_errors
from hfai.protocol.types import Priority

DEFAULT_ISSUER = Path("/etc/hfai/issuer")


def issuer_dir() -> Path:
    """``$HFAI_ISSUER`` if set, else a running local cluster's, else /etc/hfai/issuer."""
    from hfai.api.config import local_root, read_local_state

    if os.environ.get("HFAI_ISSUER"):
        return Path(os.environ["HFAI_ISSUER"])
    local = read_local_state()
    if local is not None and local.get("auth", True):
        return local_root() / "auth"
    return DEFAULT_ISSUER


def _issuer(create: bool = False):
    from hfai.auth.issuer import Issuer

    return Issuer.open(issuer_dir(), create=create)


def _creds_dir() -> Path:
    from hfai.api.config import cli_config, creds_dir

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
    from hfai.api.config import cli_config
    from hfai.auth.push import push_account

    held = _issuer().revoke(name)
    asyncio.run(push_account(_issuer(), cli_config()))
    click.echo(f"revoked {held.role.value} credentials of {name}; the cluster refuses them from now on")


@click.group(invoke_without_command=True)
@common.json_option
@click.pass_context
def quota(ctx, as_json: bool):
    """Node quotas per (user, priority, group). Alone, as `hfai quota show`: my limits and use.
    Setting them is for operators."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(quota_show, as_json=as_json)


@quota.command("show")
@common.json_option
@common.run_async
async def quota_show(as_json: bool = False):
    """My quotas next to my use: per priority and group, the limit that applies to me, the nodes my
    jobs hold, the nodes my waiting jobs ask for, and the room left."""
    from hfai.api.client import JobFilter

    async with common.api() as client:
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
@common.run_async
async def quota_set(user: str, priority: str, nodes: int, group: str):
    """Let USER's jobs of PRIORITY hold at most NODES nodes (USER may be *; NODES -1 removes it)."""
    level = Priority.parse(priority)
    if level not in {p.value for p in Priority}:
        raise click.UsageError("a quota is set for one level, not AUTO: use " + ", ".join(p.name for p in Priority))
    async with common.api() as client:
        reply = await client.set_quota(user, level, group, nodes)
    click.echo(render.quotas_table(reply.quotas, reply.quota_needed_above))


@quota.command("ls")
@common.json_option
@common.run_async
async def quota_ls(as_json: bool):
    """Show every quota."""
    async with common.api() as client:
        reply = await client.settings()
    click.echo(render.dumps(render.quotas_json(reply.quotas)) if as_json
               else render.quotas_table(reply.quotas, reply.quota_needed_above))


@click.group()
def node():
    """Take nodes out of service and back (operators)."""


@node.command("drain")
@click.argument("name")
@click.option("--reason", default="", help="Shown by `hfai nodes`.")
@common.run_async
async def node_drain(name: str, reason: str):
    """No new work on node NAME (running jobs finish)."""
    async with common.api() as client:
        await client.drain(name, True, reason)
    click.echo(f"node {render.clean(name)} drained")


@node.command("undrain")
@click.argument("name")
@common.run_async
async def node_undrain(name: str):
    """Put node NAME back in service."""
    async with common.api() as client:
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


@click.command()
@daemon_options
def controller(config_path: str | None, log_level: str):
    """Run a controller replica (same as `hfai-controller`): it serves the API, and schedules
    while it holds the lease. Runs until SIGTERM."""
    from hfai.controller.__main__ import main as run

    sys.exit(run(_daemon_argv(config_path, log_level)))


@click.command()
@daemon_options
def agent(config_path: str | None, log_level: str):
    """Run this node's agent (same as `hfai-agent`): it runs the jobs the leader assigns to the
    node ([agent] node, default the host name) and reports them. Runs until SIGTERM."""
    from hfai.agent.__main__ import main as run

    sys.exit(run(_daemon_argv(config_path, log_level)))
