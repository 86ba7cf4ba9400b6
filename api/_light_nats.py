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
  client reads one enum from it, and only for a message with headers (a no-responders status).
  It is loaded with the standard library's ``importlib.util.LazyLoader``: the module is in place at
  once and runs on its first attribute access, so the controller, the agents and an ``hfai logs``
  that use JetStream get all of it.

Where nats-py is loaded already, importing this module changes nothing.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys

_HIDDEN = ("aiohttp", "importlib.metadata")
_LAZY = "nats.js"


class _LazyFinder:
    """A meta path finder (not an ``importlib.abc`` subclass: that module imports importlib.resources,
    tempfile and shutil) that finds ``nats.js`` as the path finder does, with a lazy loader."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _LAZY:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = importlib.util.LazyLoader(spec.loader)
        return spec


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
    finder = _LazyFinder()
    sys.meta_path.insert(0, finder)
    try:
        import nats.aio.client as client
    finally:
        sys.meta_path.remove(finder)
        for name in hidden:
            if sys.modules.get(name, False) is None:
                del sys.modules[name]
    if "importlib.metadata" in hidden:
        version = _dist_version(os.path.dirname(os.path.dirname(client.__file__)), "nats_py")
        if version:
            client.__version__ = version


_import_nats()
