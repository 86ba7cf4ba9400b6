"""Importing this module imports nats-py without the aiohttp it loads for its WebSocket transport.

nats-py's ``nats.aio.transport`` imports aiohttp (and, through it, builds an SSL context) at import
time, in a ``try`` that leaves the WebSocket transport unavailable when the import fails. That is
0.13-0.2 s of every ``hfai`` call, for a transport the CLI never uses: hfai's NATS URLs are
``nats://``/``tls://``. So the client (hfai.api.client) imports this first: aiohttp is hidden while nats-py
loads, then visible again (anything else in the process may still import it). A ``ws://`` URL
gets the transport back at connect (:func:`hfai._nats.connect`).
"""

from __future__ import annotations

import sys


def _import_nats() -> None:
    if "nats" in sys.modules or "aiohttp" in sys.modules:
        return  # already loaded either way: nothing to spare
    sys.modules["aiohttp"] = None  # type: ignore[assignment]  # `import aiohttp` now raises ImportError
    try:
        import nats.aio.client  # noqa: F401
    finally:
        if "aiohttp" in sys.modules and sys.modules["aiohttp"] is None:
            del sys.modules["aiohttp"]


_import_nats()
