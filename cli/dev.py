"""``hfai dev start|list|stop``: development sessions, JupyterLab on a node of the cluster reached
through hfai-web at ``/dev/<session>/`` (docs/dev.md). A session is a job of kind ``dev``: the
controller limits how many a user has at once, the scheduler never time-slices one away, and the
agent runs JupyterLab as the user (hfai.agent.devsession)."""

from __future__ import annotations

import click

from hfai.cli import common, render
from hfai.protocol.limits import MAX_NODES
from hfai.protocol.types import Priority

DEFAULT_NAME = "dev"


def session_url(config, job_id: str) -> str:
    """Where the user opens the session: hfai-web's address and the session's path."""
    from hfai.agent.devsession import base_url

    host = config.web.host if config.web.host not in ("", "0.0.0.0", "::") else "127.0.0.1"
    return f"http://{host}:{config.web.port}{base_url(job_id)}"


def dev_spec(name: str, nodes: int, group: str, env_name: str, priority: str, workdir: str):
    from hfai.agent.devsession import ENTRYPOINT
    from hfai.protocol.types import JOB_DEV, JobSpec

    try:
        prio = Priority.parse(priority)
    except Exception as e:
        raise click.UsageError(str(e)) from None
    return JobSpec(name=name, entrypoint=ENTRYPOINT, workdir=workdir, nodes=nodes, priority=prio, group=group,
                   env_name=env_name, kind=JOB_DEV)


@click.group("dev")
def dev():
    """Development sessions: JupyterLab on the cluster, opened through hfai-web."""


@dev.command("start")
@click.option("--name", default=DEFAULT_NAME, show_default=True, help="The session's name.")
@click.option("-n", "--nodes", default=1, show_default=True, type=click.IntRange(1, MAX_NODES),
              help="Nodes (a session runs on 1).")
@click.option("-g", "--group", default="default", show_default=True, help="The node group to run on.")
@click.option("-i", "--image", "env_name", default="", help="The environment (haienv) JupyterLab runs in.")
@click.option("-p", "--priority", default="NORMAL", show_default=True, help="Priority level.")
@common.run_async
async def start(name: str, nodes: int, group: str, env_name: str, priority: str) -> None:
    """Start a session: JupyterLab with your notebooks directory as its root."""
    import os

    from hfai.api.config import cli_config

    spec = dev_spec(name, nodes, group, env_name, priority, os.getcwd())
    async with common.api() as client:
        job = await client.submit(spec)
    click.echo(f"started development session {render.clean(job.spec.name)} ({render.clean(job.id)})")
    click.echo(f"  open it at:  {session_url(cli_config(), job.id)}   (signed in to hfai-web)")
    click.echo(f"  stop it with:  hfai dev stop {render.clean(job.spec.name)}")


@dev.command("list")
@common.json_option
@common.run_async
async def list_cmd(as_json: bool) -> None:
    """Your development sessions, queued, running and recently ended."""
    import json

    from hfai.api.config import cli_config
    from hfai.protocol.types import JOB_DEV

    async with common.api() as client:
        jobs = [j for j in await client.list(all_users=False) if j.spec.kind == JOB_DEV and j.spec.user == client.user]
    config = cli_config()
    rows = [{"id": j.id, "name": j.spec.name, "state": j.state.value, "node": ",".join(j.nodes),
             "url": session_url(config, j.id) if not j.state.final else ""}
            for j in sorted(jobs, key=lambda j: (j.submit_ts, j.id))]
    if as_json:
        click.echo(json.dumps({"sessions": rows}))
        return
    if not rows:
        click.echo("no development sessions (start one with: hfai dev start)")
        return
    click.echo(f"{'ID':<12} {'NAME':<20} {'STATE':<11} {'NODE':<12} URL")
    for r in rows:
        click.echo(f"{render.clean(r['id']):<12} {render.clean(r['name']):<20} {r['state']:<11} "
                   f"{render.clean(r['node']):<12} {r['url']}")


@dev.command("stop")
@click.argument("session")
@common.run_async
async def stop(session: str) -> None:
    """Stop a session (by name or id); its notebooks stay in your notebooks directory."""
    from hfai.protocol.errors import InvalidRequest
    from hfai.protocol.types import JOB_DEV

    async with common.api() as client:
        job = await client.status(session)
        if job.spec.kind != JOB_DEV:
            raise InvalidRequest(f"{session} is a job, not a development session: stop it with hfai stop {job.id}")
        job = await client.stop(job.id)
    click.echo(f"stopping development session {render.clean(job.spec.name)} ({render.clean(job.id)})")
