"""What the two daemon entry points share: logging setup and signal-driven two-phase shutdown."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from typing import Awaitable, Callable, Protocol


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # nats-py logs every reconnect attempt at ERROR; they are expected during failovers.
    logging.getLogger("nats").setLevel(logging.CRITICAL)


async def cancel_and_wait(tasks) -> None:
    """Cancel owned tasks and wait until each has really finished (errors were theirs to log)."""
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def serve(start: Callable[[], Awaitable[None]], close: Callable[[], Awaitable[None]]) -> None:
    """Start, then wait for SIGTERM/SIGINT, then close (systemd stops us with SIGTERM)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await start()
    try:
        await stop.wait()
    finally:
        await close()


class Daemon(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...


def run_daemon(prog: str, description: str, make: Callable[[object], Daemon], argv: list[str] | None = None) -> int:
    """The shared ``main`` of ``hfai-agent`` and ``hfai-controller``: parse flags, load the config,
    build the daemon with ``make(config)``, serve until SIGTERM. Config errors exit 2, no traceback."""
    from hfai.config import load_config
    from hfai.protocol.errors import HfaiError

    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--config", help="TOML config file (default: $HFAI_CONFIG or /etc/hfai/hfai.toml)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    try:
        daemon = make(load_config(args.config))
        asyncio.run(serve(daemon.start, daemon.close))
    except HfaiError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    return 0
