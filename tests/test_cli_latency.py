"""What the CLI imports on its way to an answer (every import is wall time of every `hfai` call):
not aiohttp (nats-py's WebSocket transport, 0.13-0.2 s), which stays importable for anything else,
and a ws:// URL still gets its transport back. Timings themselves are in bench/bench_cli.py."""

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


def test_aiohttp_stays_importable_and_a_websocket_url_gets_its_transport_back():
    code = """
import asyncio, sys
import hfai.api.client
import nats.aio.transport as t
assert t.aiohttp is None
import aiohttp  # hidden only while nats-py loaded
from hfai import _nats
from hfai.config import Config, NatsConfig
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
