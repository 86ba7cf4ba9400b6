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
from hfai.protocol.limits import MAX_NODES
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
    """Operators: issue and revoke credentials (needs the issuer keys: $HFAI_ISSUER), check nodes' GPU health."""


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
    from hfai.core.accounts import push_account

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
@click.argument("nodes", type=click.IntRange(-1, MAX_NODES))
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
@click.option("--force", is_flag=True, help="Also a node drained by a GPU fault, without a passing health check.")
@common.run_async
async def node_undrain(name: str, force: bool):
    """Put node NAME back in service. A node a GPU fault drained comes back once a health check
    passes (hfai admin validate NAME); --force brings it back without one."""
    from hfai.protocol.types import HEALTH_UNDRAIN, NodeHealthRequest

    async with common.api() as client:
        await client.drain(name, False)
        faulted = any(n.record.name == name and n.record.fault is not None for n in await client.nodes())
        if faulted:  # the node's agent holds the fault and decides (agent/health.py: undrain_refusal)
            reply = await _health(client, name, NodeHealthRequest(action=HEALTH_UNDRAIN, force=force))
            click.echo(render.clean(reply.message))
            return
    click.echo(f"node {render.clean(name)} back in service")


async def _health(client, node: str, req, wait_s: float = 0.0):
    """Ask ``node``'s agent for the health operation ``req`` (operators only: NATS lets only them
    publish on agent operations), waiting up to ``wait_s`` more than a plain request."""
    from hfai.protocol import names
    from hfai.protocol.types import NodeHealthReply

    return await client.request(names.agent_op_subject(node, client.user, names.AGENT_OP_HEALTH), req,
                                NodeHealthReply, timeout=client.config.nats.request_timeout_s + wait_s)


@admin.command("fault")
@click.argument("node_name", metavar="NODE")
# Bounds a typed number must keep to (hfai.protocol.limits says why): an Xid is a C int in the
# driver's log; no node has a thousand GPUs.
@click.option("--xid", type=click.IntRange(1, 2**31 - 1), help="Inject this Xid (see docs/health.md).")
@click.option("--gpu", type=click.IntRange(0, 1023), default=0, show_default=True, help="On this GPU.")
@click.option("--signal", "signal_name", type=click.Choice(["dbe", "retired", "lost", "thermal", "power"]),
              help="Inject a polled condition instead of an Xid.")
@click.option("--clear", is_flag=True, help="Forget the injected faults (the GPUs as new).")
@common.run_async
async def admin_fault(node_name: str, xid: int | None, gpu: int, signal_name: str | None, clear: bool):
    """Inject a GPU fault into NODE's simulated GPUs (operators; refused on real GPUs): the node's
    health watch sees it as it would see NVML report it."""
    from hfai.protocol.types import HEALTH_CLEAR, HEALTH_FAULT, NodeHealthRequest

    if clear:
        req = NodeHealthRequest(action=HEALTH_CLEAR)
    elif (xid is None) == (signal_name is None):
        raise click.UsageError("give one of --xid N, --signal NAME or --clear")
    else:
        req = NodeHealthRequest(action=HEALTH_FAULT, xid=xid or 0, gpu=gpu, signal=signal_name or "xid")
    async with common.api() as client:
        reply = await _health(client, node_name, req)
    click.echo(f"{render.clean(node_name)}: {render.clean(reply.message)}")


@admin.command("validate")
@click.argument("node_name", metavar="NODE")
@click.option("--wait", "wait_s", type=float, default=300.0, show_default=True,
              help="Seconds to wait for the check (each step is bounded by [agent] health_check_step_s).")
@common.run_async
async def admin_validate(node_name: str, wait_s: float):
    """Run NODE's health check now (operators); a node a GPU fault drained comes back if it passes."""
    from hfai.protocol.types import HEALTH_VALIDATE, NodeHealthRequest

    async with common.api() as client:
        reply = await _health(client, node_name, NodeHealthRequest(action=HEALTH_VALIDATE), wait_s)
    click.echo(f"{render.clean(node_name)}: {render.clean(reply.message)}")
    if reply.fault is not None:
        click.echo(f"  still drained: {render.clean(reply.fault.text())}")
    if reply.check is None or not reply.check.ok:
        sys.exit(1)


# ------------------------------------------------------------------------------------ daemons

def daemon_options(f):
    """--config and --log-level, passed on to the daemon (whose own parser checks them too)."""
    from hfai.core.daemon import CONFIG_HELP, LOG_LEVEL_HELP, LOG_LEVELS

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
