"""Serving a Prometheus registry on ``/metrics`` from a daemon's own event loop (aiohttp), so the
collectors read the daemon's state on the loop that changes it, never from another thread."""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)


class MetricsServer:
    """``/metrics`` of one registry. ``port`` -1 picks a free port; :attr:`port` is the one bound."""

    def __init__(self, registry, host: str = "0.0.0.0", port: int = -1):
        self.registry, self.host, self.want = registry, host, port
        self.port = 0
        self._runner: Any = None  # aiohttp.web.AppRunner, imported when serving

    async def start(self) -> int:
        from aiohttp import web
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        async def metrics(_request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        self._runner = runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.host, max(0, self.want))
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("metrics on http://%s:%d/metrics", self.host, self.port)
        return self.port

    async def close(self) -> None:
        """Stop serving; safe to call twice."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
