"""``hfai local``: a whole cluster on this machine (the commands; the cluster is hfai.cli.local)."""

from __future__ import annotations

import asyncio

import click

from hfai.cli.errors import user_errors


@click.group()
def local():
    """A whole cluster on this machine: NATS, a controller, N agents with simulated GPUs.

    Its state (jobs, nodes, credentials) lives under $HFAI_HOME/local and outlives `down`: `hfai
    local down` interrupts the running jobs as the platform would (they checkpoint and are
    requeued), and the next `hfai local up` resumes them and the queued ones. `hfai local reset`
    (or `hfai local up --fresh`) forgets it all.
    """


@local.command("up")
@click.option("--nodes", default=2, show_default=True, type=click.IntRange(1, 64),
              help="Agents to start, each a node of 8 simulated GPUs (node-0, node-1, ...).")
@click.option("--slice", "slice_s", type=float, default=None,
              help="Time slice, seconds (default 600 here): a job that has held its nodes this long yields them "
                   "to a waiting job of the same priority and another user (never to its own user's). To try it, "
                   "add a user (hfai admin user add bob) and submit as them (HFAI_USER=bob hfai submit ...): "
                   "a second name, not a second person: every job here runs as your account (its compute "
                   "container keeps it from your files; where bwrap cannot work, `hfai local status` says so and "
                   "jobs can read them).")
@click.option("--fresh", is_flag=True,
              help="First forget what an earlier local cluster left here: jobs, nodes, logs and every "
                   "credential (as hfai local reset).")
@user_errors()
def local_up(nodes: int, slice_s: float | None, fresh: bool):
    """Start the local cluster in the background (state under $HFAI_HOME/local).

    The jobs an earlier cluster left here (queued, or interrupted by `hfai local down`) resume;
    its nodes beyond --nodes are forgotten, and their jobs requeued. A supervisor process keeps
    the daemons running, as systemd does on a cluster: one that dies is restarted (the delay
    doubling from 1 s to 30 s, at most 5 times in 5 minutes; its log is logs/supervisor.log), and
    nats-server too when its store refuses writes and its disk has room again.
    """
    import dataclasses

    from hfai._extras import require_platform
    from hfai.cli.local import LocalCluster
    from hfai.cli.local.daemons import free_port
    from hfai.cli.local.layout import LOCAL_AGENT, LOCAL_CONTROLLER, LOCAL_METRICS_PORT
    from hfai.cli.local.supervision import SupervisePolicy
    from hfai.core.config import WebConfig

    require_platform("hfai local up", nats_server=True)
    cc = dataclasses.replace(LOCAL_CONTROLLER, metrics_port=LOCAL_METRICS_PORT)
    cc = cc if slice_s is None else dataclasses.replace(cc, slice_s=slice_s)
    web = WebConfig()
    # Another local cluster (or anything else) on the usual port: take a free one, shown below.
    web = dataclasses.replace(web, port=free_port(web.host, web.port))
    cluster = LocalCluster(root=LocalCluster.default_root(), nodes=nodes, controller=cc, web=web,
                           agent=dataclasses.replace(LOCAL_AGENT, metrics_port=LOCAL_METRICS_PORT),
                           supervise=SupervisePolicy())
    if fresh:
        cluster.reset()
    resumed = cluster.has_state
    forgotten = cluster.up()
    cluster.wait_ready()
    click.echo(f"local cluster up: {nodes} node(s) x 8 simulated GPUs, NATS at {cluster.url}")
    click.echo(f"  state and logs: {cluster.root}   stop it with: hfai local down")
    click.echo(f"  web pages: http://{cluster.config().web.host}:{cluster.config().web.port}/  (sign in with your "
               ".creds file)")
    click.echo(f"  your operator credentials: {cluster.creds_dir}/{cluster.owner or _login()}.creds  "
               "(more users: hfai admin user add NAME)")
    click.echo("  Prometheus /metrics of every daemon: hfai local status lists their URLs")
    if resumed:
        gone = f"; forgot node(s) {', '.join(forgotten)}" if forgotten else ""
        click.echo(f"  resumed the earlier cluster's state: {_active_jobs(cluster)} job(s) in the queue{gone} "
                   "(start afresh: hfai local up --fresh)")


def _active_jobs(cluster) -> int:
    from hfai.api.client import ApiClient

    async def count() -> int:
        async with ApiClient(cluster.config(), user=cluster.owner or _login()) as client:
            return len(await client.list(all_users=True, include_finished=False))

    return asyncio.run(count())


def _login() -> str:
    from hfai.api.config import current_user

    return current_user()


@local.command("down")
@click.option("--now", is_flag=True,
              help="Do not wait for jobs to checkpoint: SIGTERM at once, SIGKILL 2 s later (requeued all the same).")
@user_errors()
def local_down(now: bool):
    """Stop the local cluster, interrupting its running jobs as the platform would.

    The controllers stop first; each running job gets the suspend flag (it may checkpoint and call
    hfai.go_suspend()), SIGTERM after the acknowledgement window and SIGKILL after the kill window.
    The jobs are requeued, never failed, and resume with the queued ones at the next `hfai local
    up`; `hfai local reset` forgets them.
    """
    from hfai.cli.local import LocalCluster

    cluster = LocalCluster.load()
    if cluster is None:
        raise click.ClickException("no local cluster is running")

    def announce(runs: int, ack_s: float) -> None:
        click.echo(f"interrupting {runs} running job rank(s): they may checkpoint"
                   + (f" (up to {ack_s:g}s; --now: at once)" if ack_s else ""))

    interrupted = cluster.interrupt_jobs(now=now, announce=announce)
    cluster.down()
    click.echo("local cluster stopped" + (f" ({interrupted} job rank(s) interrupted)" if interrupted else "")
               + "; queued and interrupted jobs resume at the next `hfai local up` (hfai local reset forgets them)")


@local.command("reset")
@user_errors()
def local_reset():
    """Forget what a local cluster left under $HFAI_HOME/local: jobs, nodes, logs and every
    credential (issued anew at the next `hfai local up`; hand out users' files again). Your files
    stay: environments (envs/), workspaces (workspaces/, gc/) and datasets/. The cluster must be
    down."""
    from hfai.cli.local import LocalCluster

    cluster = LocalCluster(root=LocalCluster.default_root())
    cluster.reset()
    click.echo(f"local cluster state under {cluster.root} wiped")


@local.command("status")
def local_status():
    """Which local daemons are alive, how often each was restarted and how it last ended,
    whether the NATS store refuses writes, and the URLs of the pages and of each daemon's /metrics."""
    from hfai.cli.local import LocalCluster

    cluster = LocalCluster.load()
    if cluster is None:
        raise click.ClickException("no local cluster is running")
    click.echo(f"NATS {cluster.url}, state in {cluster.root}")
    for line in cluster.status_lines():
        click.echo(line)
    for what, url in cluster.urls():
        click.echo(f"  {what + ':':<28} {url}")

