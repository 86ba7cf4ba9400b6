"""Importing this module imports nats-py's core client without what it loads and a CLI call never
uses. The one place that relies on how nats-py imports; tests/test_cli_startup_adapters.py checks
each assumption against the installed nats-py, so an upgrade that breaks one fails there.

* ``nats.aio.transport`` imports aiohttp (its WebSocket transport) in a ``try`` that leaves that
  transport unavailable when the import fails: most of nats-py's import time (docs/performance.md),
  for a transport hfai's ``nats://``/``tls://`` URLs never use. aiohttp is hidden while nats-py
  loads (``sys.modules[name] = None``: the import system's documented way to make an import fail),
  then visible again for anything else in the process; a ``ws://`` URL gets the transport back at
  connect (:func:`hfai.core.nats.connect`).
* ``importlib.metadata``, which nats-py imports in a ``try`` for its own version string (sent in
  CONNECT), is hidden too; the version is read from the name of nats-py's ``.dist-info`` folder.
* ``import nats.js``, the JetStream client (its API dataclasses, the KV and object stores): the core
  client imports it but reads one enum from it, and only for a message with headers (a
  no-responders status). While the core client loads, ``nats.js`` is a stand-in module whose
  module-level ``__getattr__`` (PEP 562) imports the real one at its first use; the stand-in is then
  taken out of ``sys.modules``, so the next ``import nats.js`` or ``import nats.js.errors`` (the
  controller, the agents, ``hfai logs``) loads the real package once, by the import system's own
  path. (The standard library's ``LazyLoader`` is not enough: importing a submodule of a lazy
  package runs the package, which imports that submodule, and the import then runs the submodule
  again, so ``nats.js.errors`` came in twice and an ``except`` on one copy's class missed the other's.)

Where nats-py is loaded already, importing this module changes nothing.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

_HIDDEN = ("aiohttp", "importlib.metadata")
_LAZY = "nats.js"


def _stand_in() -> types.ModuleType:
    """A ``nats.js`` that imports the real one when an attribute is first read from it."""
    stand_in = types.ModuleType(_LAZY, "hfai.api._light_nats's stand-in: the real nats.js loads at first use")

    def __getattr__(name: str):
        if sys.modules.get(_LAZY) is stand_in:
            del sys.modules[_LAZY]
        return getattr(importlib.import_module(_LAZY), name)  # also puts the real one on the nats package

    stand_in.__getattr__ = __getattr__  # type: ignore[method-assign]
    return stand_in


def _dist_version(package_dir: str, dist: str) -> str | None:
    prefix = f"{dist}-"
    try:
        with os.scandir(os.path.dirname(package_dir)) as entries:
            for e in entries:
                if e.name.startswith(prefix) and e.name.endswith(".dist-info"):
                    return e.name[len(prefix):-len(".dist-info")]
    except OSError:
        pass  # no version to find: nats-py's own fallback ("0.0.0") stays
    return None


def _import_nats() -> None:
    if "nats" in sys.modules:
        return  # already loaded: nothing to spare
    hidden = [name for name in _HIDDEN if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` now raises ImportError
    stand_in = sys.modules[_LAZY] = _stand_in()  # `import nats.js` in the client finds it in place
    try:
        import nats.aio.client as client
    finally:
        if sys.modules.get(_LAZY) is stand_in:
            del sys.modules[_LAZY]  # the next import of nats.js, or of a submodule, loads the real one
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    nats = sys.modules["nats"]
    if not hasattr(nats, "js"):  # set by the import system only when it loads a module itself
        nats.js = stand_in  # type: ignore[attr-defined]  # what the client's `nats.js.api` reads
    if "importlib.metadata" in hidden:
        version = _dist_version(os.path.dirname(os.path.dirname(client.__file__)), "nats_py")
        if version:
            client.__version__ = version


_import_nats()
