"""What the CLI imports on its way to an answer (every import is wall time of every `hfai` call):
not aiohttp (nats-py's WebSocket transport, 0.13-0.2 s), which stays importable for anything else,
and a ws:// URL still gets its transport back; nats-py's JetStream client only when used, and no
importlib.metadata; `hfai --help` no command's module. Timings themselves are in bench/bench_cli.py."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["hfai.api.client", "hfai.storage.client"])
def test_the_cli_client_loads_nats_without_aiohttp(module):
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('nats', 'aiohttp')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    loaded = eval(r.stdout)
    assert "nats.aio.client" in loaded and not [m for m in loaded if m.startswith("aiohttp")]


def test_the_cli_client_leaves_jetstream_unloaded_and_still_names_nats_pys_version():
    code = """
import sys, hfai.api.client, nats.aio.client
print(repr(sorted(m for m in sys.modules if m.startswith("nats.js"))))
print(repr("importlib.metadata" in sys.modules))
print(repr(nats.aio.client.__version__))
import importlib.metadata
print(repr(importlib.metadata.version("nats-py")))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    js_modules, metadata, version, real = map(eval, r.stdout.splitlines())
    assert js_modules == []  # a stand-in on the nats package until first used (hfai.api._light_nats)
    assert metadata is False
    assert version == real != "0.0.0"


def test_jetstream_and_no_responders_work_after_the_light_import(nats_url):
    """The core client reads nats.js.api.Header on a reply with headers (no responders); the
    daemons' KV use imports all of nats.js: both against a real nats-server."""
    code = f"""
import asyncio, sys
import hfai.api.client
import nats, nats.errors

async def main():
    nc = await nats.connect({nats_url!r})
    try:
        await nc.request("nobody.listens.here", b"", timeout=5)
    except nats.errors.NoRespondersError:
        print("NO RESPONDERS")
    assert "nats.js.api" in sys.modules
    js = nc.jetstream()
    kv = await js.create_key_value(bucket="light")
    await kv.put("k", b"v")
    print("KV", (await kv.get("k")).value.decode())
    await nc.close()

asyncio.run(main())
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["NO RESPONDERS", "KV v"]


def test_aiohttp_stays_importable_and_a_websocket_url_gets_its_transport_back():
    code = """
import asyncio, sys
import hfai.api.client
import nats.aio.transport as t
assert t.aiohttp is None
import aiohttp  # hidden only while nats-py loaded
from hfai.core import nats as _nats
from hfai.core.config import Config, NatsConfig
from hfai.protocol.errors import Unavailable
config = Config(nats=NatsConfig(url="ws://127.0.0.1:1", connect_timeout_s=0.5))
try:
    asyncio.run(_nats.connect(config, "t", reconnect=False, creds=""))
except Unavailable as e:
    print("UNAVAILABLE", e)
assert t.aiohttp is aiohttp, "ws:// needs nats-py's WebSocket transport"
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "UNAVAILABLE cannot reach NATS at ws://127.0.0.1:1" in r.stdout


def test_help_imports_neither_nats_nor_aiohttp():
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "hfai.cli.main", "--help"], capture_output=True,
                       text=True)
    assert r.returncode == 0 and "Usage" in r.stdout
    imported = {line.rsplit("|", 1)[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert not {"nats", "torch", "aiohttp"} & imported


def test_help_imports_no_commands_module():
    code = ("import sys; from click.testing import CliRunner; from hfai.cli.main import main; "
            "r = CliRunner().invoke(main, ['--help']); assert r.exit_code == 0, r.output; "
            "print(sorted(m for m in sys.modules if m.startswith(('hfai.cli.', 'hfai.protocol', 'asyncio'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert eval(r.stdout) == ["hfai.cli.main"]


@pytest.mark.parametrize("width", [50, 80, 200])
def test_help_lists_each_command_as_clicks_own_listing_would(width):
    """The summaries in cli/main.py stand in for each command's own help: a command added or
    reworded without its summary fails here."""
    import click
    from click.testing import CliRunner

    from hfai.cli import main as cli_main

    ctx = click.Context(cli_main.main)
    for name in cli_main.LAZY_COMMANDS:
        cmd = cli_main.main.get_command(ctx, name)
        assert cmd is not None and not cmd.hidden, name
        assert name in cli_main.SUMMARIES, f"cli/main.py SUMMARIES has no {name!r}"
        for limit in (20, 45, 70, 150):
            ours = click.Command(name, help=cli_main.SUMMARIES[name]).get_short_help_str(limit)
            assert ours == cmd.get_short_help_str(limit), name

    class ClicksOwn(cli_main.LazyGroup):
        format_commands = click.Group.format_commands

    own = ClicksOwn(name="hfai", callback=cli_main.main.callback, params=cli_main.main.params,
                    help=cli_main.main.help, context_settings=cli_main.main.context_settings)
    ours = CliRunner().invoke(cli_main.main, ["--help"], prog_name="hfai", terminal_width=width)
    theirs = CliRunner().invoke(own, ["--help"], prog_name="hfai", terminal_width=width)
    assert ours.exit_code == theirs.exit_code == 0
    assert ours.output == theirs.output
