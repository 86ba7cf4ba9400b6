"""``hfai workspace``: sync a local project directory to the cluster and run jobs in the copy.

    hfai workspace init [NAME]        # mark this directory as workspace NAME (default: its name)
    hfai workspace push [--bwlimit KB] [--dry-run]  # send what changed (only the chunks the cluster lacks)
    hfai workspace pull NAME [DIR]    # fetch the cluster's copy
    hfai workspace list | remove NAME | usage | restore-request

``.hfignore`` (gitignore syntax) keeps files behind. Progress (bytes, rate, time left) goes to stderr.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import click

from hfai.cli.errors import user_errors


def _config():
    from hfai.api.config import cli_config

    return cli_config()


def _client():
    from hfai.storage.client import StorageClient

    return StorageClient(_config())


@contextlib.contextmanager
def _bar(label: str, length: int):
    """A progress bar on stderr: bytes done, rate and time left (tqdm)."""
    from tqdm import tqdm  # type: ignore[import-untyped]  # no stubs shipped; only this call uses it

    with tqdm(total=length or None, desc=label, unit="B", unit_scale=True, unit_divisor=1000, file=sys.stderr,
              mininterval=0.25, leave=True, dynamic_ncols=True) as bar:
        yield bar


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


@click.group()
def workspace():
    """Sync a project directory to the cluster; jobs submitted from it run in the cluster's copy."""


@workspace.command("init")
@click.argument("name", required=False)
@user_errors()
def init(name: str | None):
    """Make the current directory workspace NAME (default: the directory's name)."""
    from hfai.storage.marker import init as do_init

    marker = do_init(Path.cwd(), name)
    click.echo(f"workspace {marker.name} at {Path.cwd()}; `hfai workspace push` sends it to the cluster "
               "(.hfignore lists what stays behind)")


@workspace.command("push")
@click.option("--bwlimit", type=click.IntRange(min=0), default=0, help="At most this many KB/s (0: no limit).")
@click.option("-n", "--dry-run", is_flag=True, help="List what would move (files, chunks, bytes); send nothing.")
@user_errors()
def push(bwlimit: int, dry_run: bool):
    """Send the workspace containing the current directory: only the chunks the cluster lacks."""
    import asyncio

    asyncio.run(_push(bwlimit, dry_run))


async def _push(bwlimit: int, dry_run: bool) -> None:
    from hfai.api.workspace import find_root
    from hfai.protocol.errors import InvalidRequest

    root = find_root(Path.cwd())
    if root is None:
        raise InvalidRequest("not inside a workspace; `hfai workspace init` first")
    sc = _config().storage
    if dry_run:
        async with _client() as client:
            await _dry_run(client, root, sc.chunk_bytes)
        return
    from hfai.storage.manifest import start_scan
    from hfai.storage.push import drop

    walking = start_scan(root)  # the tree is walked while the client connects
    try:
        async with _client() as client:
            result = await _push_with_bars(client, root, sc, bwlimit, walking)
    finally:
        await drop(walking)  # ended already, unless connecting failed
    if result.current:
        click.echo(f"{result.info.name} is up to date: {result.files} files, {_mb(result.info.bytes)}; nothing "
                   f"to send; on the cluster at {result.info.path}")
        return
    click.echo(f"pushed {result.info.name}: {result.files} files, {_mb(result.info.bytes)}; sent {result.sent_chunks} "
               f"of {result.chunks} chunks ({_mb(result.sent_bytes)}); on the cluster at {result.info.path}")


async def _push_with_bars(client, root: Path, sc, bwlimit: int, walking=None):
    """The push, with progress bars on stderr (bytes, rate, ETA): hashing, then sending."""
    from hfai.storage.push import push as do_push

    with _Bars() as bars:
        def planned(chunks: int, size: int) -> None:
            click.echo(f"{chunks} chunk(s) to send ({_mb(size)})", err=True)
            if size:
                keep_freed_memory()
            bars.open("sending", size)

        return await do_push(client, root, sc.chunk_bytes, sc.request_bytes, sc.commit_timeout_s,
                             on_hash=bars.update, on_send=bars.update, on_plan=planned, bwlimit=bwlimit * 1000,
                             on_total=lambda n: bars.open("hashing", n), walking=walking)


#: glibc's mallopt parameters, and what a push sets them to (keep_freed_memory).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's most
TRIM_THRESHOLD = 256 * 1024 * 1024


def keep_freed_memory() -> bool:
    """Have glibc's allocator keep the memory this process frees, for its next allocations: a
    push's data path makes fresh buffers of 0.5-4 MiB for every request (the chunks read, msgpack's
    request, nats-py's command and asyncio's join of it), which glibc otherwise maps and unmaps
    (or trims) each time, so that every page of every one is faulted in anew (docs/storage.md).
    Only in a push's own process, once it has bytes to send. ``mallopt`` is glibc's public
    interface (no Python binding: ctypes); the result says whether both settings were taken:
    False where the C library is not glibc (the push is then as fast as that allocator makes it),
    and tests/test_cli_startup_adapters.py fails where glibc refuses them."""
    if "CS_GNU_LIBC_VERSION" not in getattr(os, "confstr_names", {}) or not os.confstr("CS_GNU_LIBC_VERSION"):
        return False  # not glibc (musl, macOS, Windows): no mallopt to call
    import ctypes

    mallopt = ctypes.CDLL(None).mallopt  # glibc has had it always: a missing one is an error
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) & bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


class _Bars(contextlib.ExitStack):
    """One progress bar at a time, opened only for a phase with bytes to show: an unchanged push
    shows none and never imports tqdm (tens of milliseconds of a push that takes a few hundred)."""

    def __init__(self) -> None:
        super().__init__()
        self._bar = None

    def open(self, label: str, size: int) -> None:
        self.close()
        self._bar = self.enter_context(_bar(label, size)) if size else None

    def update(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)


async def _dry_run(client, root: Path, chunk_bytes: int) -> None:
    from hfai.api.workspace import read_marker
    from hfai.storage.push import outgoing
    from hfai.storage.rules import check_workspace_name

    name = check_workspace_name(read_marker(root).name)
    with _Bars() as bars:
        out = await outgoing(client, root, name, chunk_bytes, on_hash=bars.update,
                             on_total=lambda n: bars.open("hashing", n))
    for path, chunks, size in out.files():
        click.echo(f"{_mb(size):>10}  {chunks:>5} chunk(s)  {path}")
    click.echo(f"would send {out.sending} of {out.chunks} chunks ({_mb(out.bytes)}) of "
               f"{len(out.manifest.files)} files to workspace {name} (dry run: nothing sent)")


@workspace.command("pull")
@click.argument("name")
@click.argument("dest", required=False, type=click.Path(file_okay=False, path_type=Path))
@user_errors()
async def pull(name: str, dest: Path | None):
    """Fetch the cluster's copy of workspace NAME into DEST (default: ./NAME)."""
    from hfai.storage.pull import pull as do_pull

    dest = dest or Path.cwd() / name
    async with _client() as client:
        with contextlib.ExitStack() as drawn:
            bar = None

            def moved(n: int) -> None:
                # The bar appears with the first bytes: a pull refused at once (no such workspace)
                # prints its error alone.
                nonlocal bar
                if bar is None:
                    bar = drawn.enter_context(_bar("pulling", 0))
                bar.update(n)

            n = await do_pull(client, name, dest, _config().storage.request_bytes, on_bytes=moved)
    click.echo(f"pulled {name} into {dest}: {n} file(s) written")


@workspace.command("list")
@user_errors()
async def list_cmd():
    """Your workspaces on the cluster."""
    from hfai.protocol import storage as s

    async with _client() as client:
        reply = await client.scall(s.WS_LIST, s.ListWorkspaces())
    if not reply.workspaces:
        click.echo("no workspaces (hfai workspace init NAME, then hfai workspace push, makes one)")
        return
    click.echo(f"{'NAME':<24} {'FILES':>7} {'SIZE':>10}  PATH")
    for w in reply.workspaces:
        click.echo(f"{w.name:<24} {w.files:>7} {_mb(w.bytes):>10}  {w.path}")


@workspace.command("remove")
@click.argument("name")
@user_errors()
async def remove(name: str):
    """Delete workspace NAME from the cluster."""
    from hfai.protocol import storage as s

    async with _client() as client:
        info = await client.scall(s.WS_REMOVE, s.WorkspaceRequest(workspace=name))
    click.echo(f"removed {info.name} ({_mb(info.bytes)}) from the cluster")


def _show_usage(u) -> None:
    from hfai.storage.rules import human

    click.echo(f"{u.user}: workspaces hold {human(u.used)} of {human(u.limit)}")
    for w in u.workspaces:
        click.echo(f"  {w.name:<24} {human(w.bytes):>10}")
    if u.restricted:
        click.echo(f"RESTRICTED: {u.restricted}")


@workspace.command("usage")
@user_errors()
async def usage():
    """How much your workspaces hold, the limit, and whether you are restricted."""
    from hfai.protocol import storage as s

    async with _client() as client:
        _show_usage(await client.scall(s.USAGE, s.UsageRequest()))


@workspace.command("restore-request")
@user_errors()
async def restore_request():
    """After cleaning up: have the cluster measure your usage again and lift the restriction."""
    from hfai.protocol import storage as s

    async with _client() as client:
        u = await client.scall(s.RESTORE, s.UsageRequest())
    _show_usage(u)
    if u.restricted:
        raise click.ClickException("still over the limit; remove more (hfai workspace remove NAME) and ask again")
    click.echo("not restricted: your jobs may run")
