"""What the two daemon entry points share: logging setup and signal-driven two-phase shutdown."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Awaitable, Callable


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # nats-py logs every reconnect attempt at ERROR; they are expected during failovers.
    logging.getLogger("nats").setLevel(logging.CRITICAL)


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
