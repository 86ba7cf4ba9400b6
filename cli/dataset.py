"""``hfai dataset``: datasets jobs read at ``$HFAI_DATASETS_DIR/<name>`` (read-only)."""

from __future__ import annotations

import click

from hfai.cli.errors import user_errors


def _client():
    from hfai.api.config import cli_config
    from hfai.storage.client import StorageClient

    return StorageClient(cli_config())


@click.group()
def dataset():
    """Public and group-private datasets, read-only to jobs."""


@dataset.command("list")
@user_errors()
async def list_cmd():
    """Every dataset, with who may read it."""
    from hfai.protocol import storage as s

    async with _client() as client:
        reply = await client.scall(s.DATASET_LIST, s.DatasetListRequest())
    if not reply.datasets:
        click.echo("no datasets (an operator publishes one with: hfai dataset add NAME PATH)")
        return
    click.echo(f"{'NAME':<24} {'READABLE BY':<20} PATH")
    for d in reply.datasets:
        click.echo(f"{d.name:<24} {('everyone' if d.public else 'group ' + d.group):<20} {d.path}")


@dataset.command("add")
@click.argument("name")
@click.argument("path")
@click.option("--group", default="", help="Private to this Unix group (default: public).")
@user_errors()
async def add(name: str, path: str, group: str):
    """Operators: publish the directory PATH (on the shared filesystem) as dataset NAME."""
    from hfai.protocol import storage as s

    async with _client() as client:
        d = await client.scall(s.DATASET_ADD, s.DatasetAddRequest(name=name, path=path, group=group))
    click.echo(f"dataset {d.name} at {d.path}, readable by {'everyone' if d.public else 'group ' + d.group}")
