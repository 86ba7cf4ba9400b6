"""Connecting to NATS: the CLI gives up quickly with a clear error when nothing answers, and a
daemon started before NATS waits and connects once the server comes up (real nats-server)."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time

import pytest
from ports import free_port
from waits import until

from hfai.cli.local.nats_server import start_nats
from hfai.core import nats as _nats
from hfai.core.config import Config, NatsConfig
from hfai.protocol.errors import Unavailable


def test_cli_without_a_cluster_fails_fast_with_a_clear_error(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_")}
    env.update(HFAI_HOME=str(tmp_path), HFAI_NATS_URL=f"nats://127.0.0.1:{free_port()}",
               HFAI_NATS_CONNECT_TIMEOUT_S="0.5")  # fmt: skip
    # Before the bound in _nats.connect this waited forever: the subprocess timeout would trip.
    r = subprocess.run([sys.executable, "-m", "hfai.cli.main", "ps"], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=60)  # fmt: skip
    assert r.returncode == 1, r
    assert "cannot reach NATS" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_cli_connect_raises_unavailable():
    config = Config(nats=NatsConfig(url=f"nats://127.0.0.1:{free_port()}", connect_timeout_s=0.3))
    with pytest.raises(Unavailable, match="cannot reach NATS"):
        asyncio.run(asyncio.wait_for(_nats.connect(config, "t", reconnect=False), 30))


def test_daemon_waits_for_nats_to_come_up(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(_nats, "WAIT_LOG_INTERVAL_S", 0.2)  # the waiting branch loops, logging
    port = free_port()
    config = Config(nats=NatsConfig(url=f"nats://127.0.0.1:{port}", connect_timeout_s=0.5))

    def waited() -> int:
        return sum("still waiting for NATS" in r.getMessage() for r in caplog.records)

    async def go():
        attempt = asyncio.ensure_future(_nats.connect(config, "daemon", reconnect=True))
        await until(lambda: waited() >= 3, 30, "the daemon to say three times that it waits")
        assert not attempt.done(), "connected with no server?"
        server, _url = start_nats(tmp_path / "js", tmp_path / "nats.log", port=port)
        try:
            nc = await asyncio.wait_for(attempt, 30)
            assert nc.is_connected
            await nc.close()
        finally:
            server.terminate()
            server.wait(10)

    with caplog.at_level(logging.WARNING, logger=_nats.__name__):
        asyncio.run(go())


def test_a_daemon_waiting_for_nats_retries_after_growing_jittered_waits():
    """Not every 0.5 s in lockstep (a fleet that lost its server): each wait is drawn from half to
    all of a ceiling that doubles up to RECONNECT_WAIT_CAP_S while the server stays away."""
    config = Config(nats=NatsConfig(url=f"nats://127.0.0.1:{free_port()}", connect_timeout_s=0.5))
    failed: list[float] = []

    async def on_error(_e: Exception) -> None:
        failed.append(time.monotonic())

    async def go():
        attempt = asyncio.ensure_future(_nats.connect(config, "daemon", reconnect=True, on_error=on_error))
        await until(lambda: len(failed) >= 3, 30, "three refused attempts")
        attempt.cancel()
        await asyncio.gather(attempt, return_exceptions=True)

    asyncio.run(go())
    waits = [b - a for a, b in zip(failed, failed[1:], strict=False)]
    base, cap = _nats.RECONNECT_WAIT_S, _nats.RECONNECT_WAIT_CAP_S
    assert len(waits) >= 2, waits
    for i, w in enumerate(waits):
        ceiling = min(cap, base * 2 ** (i + 1))
        assert ceiling / 2 - 0.05 <= w <= ceiling + 0.3, (i, waits)
