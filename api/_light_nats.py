"""Importing this module imports nats-py's core client without what it loads and a CLI call never uses.

Three of ``nats.aio.client``'s imports cost more than everything else an ``hfai ps`` does
(docs/performance.md):

* ``nats.aio.transport`` imports aiohttp (and, through it, builds an SSL context), in a ``try``
  that leaves the WebSocket transport unavailable when the import fails, for a transport hfai's
  ``nats://``/``tls://`` URLs never use. aiohttp is hidden while nats-py loads, then visible again
  (anything else in the process may still import it); a ``ws://`` URL gets the transport back at
  connect (:func:`hfai._nats.connect`).
* ``import nats.js``, the JetStream client (its API dataclasses, the KV and object stores, the
  email parser). The core client reads one enum from it, and only for a message with
  headers (a no-responders status). ``nats.js`` is loaded lazily (``importlib.util.LazyLoader``):
  the module is in place at once and runs on its first attribute access, so the controller,
  the agents and a ``hfai logs`` that use JetStream get all of it.
* ``importlib.metadata``, for nats-py's own version string (sent in CONNECT). It is
  hidden too, and the version is read from the name of nats-py's ``.dist-info`` folder.

And ``ssl`` (OpenSSL's bindings and their enums), which a ``nats://`` connection never
uses. asyncio imports it in a ``try`` and reads two of its exceptions as it loads, nats-py
imports it outright. So when neither asyncio nor ssl is loaded yet (a CLI command that imports
this module first), asyncio is loaded with ssl hidden, and nats-py gets ``ssl`` lazily (as
``nats.js``). The first use of any of ssl's names (an SSL context made for a ``tls://`` URL or
``[nats] tls_ca``, nats-py's default context for a server that requires TLS, anything else in the
process) runs the module, and asyncio is then given it back (:func:`_give_asyncio_ssl`), before
any TLS connection can be made.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

_HIDDEN = ("aiohttp", "importlib.metadata")


class _LazyModule(importlib.util._LazyModule):  # type: ignore[name-defined]
    """importlib.util.LazyLoader's module, except that reading its ``__spec__`` does not run it:
    the import system reads it at every later ``import ssl`` (nats-py's transport has one)."""

    def __getattribute__(self, attr: str) -> Any:
        if attr == "__spec__":
            return object.__getattribute__(self, attr)
        return super().__getattribute__(attr)


class _LazyLoader(importlib.util.LazyLoader):
    def exec_module(self, module: types.ModuleType) -> None:
        super().exec_module(module)
        module.__class__ = _LazyModule


class _ThenGiveAsyncio:
    """ssl's own loader, which gives asyncio the module once it ran."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        spec: Any = module.__spec__
        spec.loader = module.__loader__ = self.loader  # as if loaded the plain way
        self.loader.exec_module(module)
        _give_asyncio_ssl(module)


class _LazyModules:
    """A meta path finder (not an ``importlib.abc`` subclass: that module imports importlib.resources,
    tempfile and shutil) that finds ``nats.js`` (and ``ssl``, when asked) as the path finder does,
    with their loaders made lazy."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            loader: Any = _ThenGiveAsyncio(spec.loader) if fullname == "ssl" else spec.loader
            spec.loader = _LazyLoader(loader)
        return spec


def _import_asyncio_without_ssl() -> None:
    sys.modules["ssl"] = None  # type: ignore[assignment]  # asyncio's `import ssl` raises ImportError
    try:
        import asyncio  # noqa: F401
    finally:
        if sys.modules.get("ssl", False) is None:
            del sys.modules["ssl"]


def _give_asyncio_ssl(ssl: types.ModuleType) -> None:
    """What asyncio's modules take from ssl as they load, given to them now that it is loaded: the
    module itself where they hold None for it, and the errors asyncio.sslproto reads at its top."""
    for name, module in list(sys.modules.items()):
        if (name == "asyncio" or name.startswith("asyncio.")) and module is not None \
                and "ssl" in vars(module) and vars(module)["ssl"] is None:
            module.ssl = ssl  # type: ignore[attr-defined]
    sslproto = sys.modules.get("asyncio.sslproto")
    if sslproto is not None and not hasattr(sslproto, "SSLAgainErrors"):
        sslproto.SSLAgainErrors = (ssl.SSLWantReadError, ssl.SSLSyscallError)  # type: ignore[attr-defined]


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
    lazy = {"nats.js"}
    if "ssl" not in sys.modules and "asyncio" not in sys.modules:
        _import_asyncio_without_ssl()
        lazy.add("ssl")
    hidden = [name for name in _HIDDEN if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # `import name` now raises ImportError
    finder = _LazyModules(frozenset(lazy))
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
