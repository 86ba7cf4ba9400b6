"""The assumptions the CLI's start-up adapters make about other packages' insides, each checked
against what is installed, so that an upgrade that breaks one fails here and not, silently, as a
slower or different `hfai` call (docs/performance.md, "Adapters"):

* hfai.api._light_nats: nats-py's transport imports aiohttp in a ``try`` and runs without it;
  nats-py reads its version with importlib.metadata in a ``try``; its core client needs nothing
  of ``nats.js`` to load (a stand-in that imports the real one at first use is enough).
* hfai.auth.nkey: PyNaCl's private cffi module ``nacl._sodium`` is there and signs as PyNaCl's
  public ``nacl.bindings`` does.
* hfai.cli.main._exit_now: CPython's ``atexit._run_exitfuncs`` runs the handlers, once.
* hfai.cli.workspace.keep_freed_memory: glibc's ``mallopt`` takes the two settings.

* hfai.core.nats.read_in: nats-py 2.x has the module constant ``DEFAULT_BUFFER_SIZE`` (that it reads
  its sockets that many bytes at a time is checked on a real connection in
  tests/test_storage_push.py).

Each import check is a fresh process: this one loaded all of it long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import ClassVar  # at the top: dataclass() finds a string's ClassVar in the module

import pytest


def _fresh(code: str) -> dict:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.splitlines()[-1])


# ----------------------------------------------------------------------- hfai.api._light_nats

LIGHT = """
import json, sys
import hfai.api._light_nats
import nats.aio.client, nats.aio.transport
loaded = {name: name in sys.modules for name in ("aiohttp", "importlib.metadata", "nats.js.api", "nats.js.client")}
out = {"loaded": loaded, "transport_aiohttp": nats.aio.transport.aiohttp is None,
       "version": nats.aio.client.__version__, "js_in_place": "nats.js" in sys.modules,
       "stand_in": nats.js.__doc__.startswith("hfai.api._light_nats's stand-in")}
import nats.js
out["js_context"] = nats.js.JetStreamContext.__name__  # its first use runs the module
import importlib.metadata
out["installed"] = importlib.metadata.version("nats-py")
print(json.dumps(out))
"""


def test_nats_py_loads_without_aiohttp_and_importlib_metadata_and_with_nats_js_lazy():
    out = _fresh(LIGHT)
    assert out["loaded"] == {"aiohttp": False, "importlib.metadata": False, "nats.js.api": False,
                             "nats.js.client": False}
    assert out["transport_aiohttp"] is True  # nats-py's own fallback: no WebSocket transport yet
    assert out["js_in_place"] is False  # the next import loads the real one by the usual path
    assert out["stand_in"] is True  # what the core client reads at its first use of nats.js
    assert out["js_context"] == "JetStreamContext"
    assert out["version"] == out["installed"]  # read from its .dist-info folder: what CONNECT sends


def test_a_submodule_of_nats_js_imported_after_the_core_client_is_loaded_once():
    """An ``except nats.js.errors.X`` in the process must catch what nats.js's client raises: with
    the standard library's LazyLoader it did not (the submodule ran twice, so two classes)."""
    out = _fresh("import json, sys\n"
                 "import hfai.api._light_nats\n"
                 "import nats, nats.js.errors\n"
                 "import nats.js.client, nats.js.kv\n"
                 "print(json.dumps([nats.js.client.BucketNotFoundError is nats.js.errors.BucketNotFoundError,\n"
                 "                  nats.js.JetStreamContext is nats.js.client.JetStreamContext,\n"
                 "                  nats.js is sys.modules['nats.js'], nats.js.api.Header.__name__]))")
    assert out == [True, True, True, "Header"]


def test_what_is_hidden_while_nats_py_loads_is_importable_again_after():
    out = _fresh("import json, hfai.api._light_nats, aiohttp, importlib.metadata, asyncio.sslproto, ssl\n"
                 "print(json.dumps([aiohttp.__name__, importlib.metadata.__name__, ssl.SSLContext.__name__]))")
    assert out == ["aiohttp", "importlib.metadata", "SSLContext"]


def test_a_websocket_url_gets_nats_pys_transport_back():
    out = _fresh("import json, hfai.api._light_nats, nats.aio.transport\n"
                 "from hfai.core import nats as _nats\n"
                 "_nats._websocket_transport()\n"
                 "print(json.dumps(nats.aio.transport.aiohttp.__name__))")
    assert out == "aiohttp"


def test_the_core_client_runs_nats_js_at_its_first_use_a_no_responders_status(tmp_path):
    """nats-py reads ``nats.js.api.Header`` for a message with headers: the lazy module runs then."""
    from hfai.cli.local.nats_server import start_nats

    proc, url = start_nats(tmp_path / "js", tmp_path / "nats.log")
    code = f"""
import asyncio, json, sys
import hfai.api._light_nats
import nats, nats.errors
async def main():
    nc = await nats.connect({url!r})
    before = "nats.js.client" in sys.modules
    try:
        await nc.request("nobody.listens", b"", timeout=10)
    except nats.errors.NoRespondersError:
        print(json.dumps([before, "nats.js.client" in sys.modules, "no responders"]))
    finally:
        await nc.close()
asyncio.run(main())
"""
    try:
        assert _fresh(code) == [False, True, "no responders"]
    finally:
        proc.terminate()
        proc.wait(10)


# ------------------------------------------------------------------------------ hfai.core.nats.read_in

def test_read_in_sets_nats_pys_read_size_and_says_so_where_it_has_none(monkeypatch, caplog):
    """Where nats-py reads with it: tests/test_storage_push.py, on a real connection."""
    import nats.aio.client

    from hfai.core import nats as _nats

    assert isinstance(nats.aio.client.DEFAULT_BUFFER_SIZE, int)
    monkeypatch.setattr(nats.aio.client, "DEFAULT_BUFFER_SIZE", nats.aio.client.DEFAULT_BUFFER_SIZE)
    assert _nats.read_in(1 << 20) is True and nats.aio.client.DEFAULT_BUFFER_SIZE == 1 << 20
    monkeypatch.delattr(nats.aio.client, "DEFAULT_BUFFER_SIZE")
    with caplog.at_level("WARNING", logger="hfai.core.nats"):
        assert _nats.read_in(1 << 20) is False
    assert "no DEFAULT_BUFFER_SIZE" in caplog.text


# ----------------------------------------------------------------------------- hfai.auth.nkey

def test_pynacls_private_sodium_module_is_there_and_signs_as_its_public_bindings():
    """nkey signs through ``nacl._sodium`` (PyNaCl's cffi module: its public ``nacl.bindings``
    costs several times more to import). A PyNaCl that moved or changed it fails here."""
    from nacl.bindings import crypto_sign, crypto_sign_seed_keypair

    from hfai.auth import nkey

    ffi, lib = nkey._libsodium()
    assert ffi is not None and lib is not None, "nacl._sodium is gone: hfai.auth.nkey falls back to nacl.bindings"
    for name in ("crypto_sign_seed_keypair", "crypto_sign", "sodium_memzero", "sodium_init"):
        assert hasattr(lib, name), name
    import nkeys

    for size in (0, 1, 64, 1000):
        raw, data = os.urandom(32), os.urandom(size)
        seed = nkeys.encode_seed(raw, nkeys.PREFIX_BYTE_USER)
        public = crypto_sign(data, crypto_sign_seed_keypair(raw)[1])[:nkey.SIGNATURE_BYTES]
        assert nkey.sign(seed, data) == public


# ------------------------------------------------------------------------ hfai.cli.main._exit_now

def test_cpythons_atexit_runner_runs_the_handlers_once():
    """_exit_now runs the atexit handlers with ``atexit._run_exitfuncs`` before ``os._exit``; a
    Python without it gets the usual exit (slower), and fails here."""
    code = """
import atexit, os
atexit.register(print, "handler", flush=True)
atexit._run_exitfuncs()
print("ran", flush=True)
os._exit(0)
"""
    for how in (code, code.replace("os._exit(0)", "")):  # and forgets them: the usual exit does not run them again
        r = subprocess.run([sys.executable, "-c", how], capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stdout.split()) == (0, ["handler", "ran"]), r.stderr


# ------------------------------------------------------------- hfai.cli.workspace.keep_freed_memory

def test_glibcs_mallopt_takes_the_push_settings():
    if "CS_GNU_LIBC_VERSION" not in getattr(os, "confstr_names", {}) or not os.confstr("CS_GNU_LIBC_VERSION"):
        pytest.skip("glibc's allocator only")
    out = subprocess.run([sys.executable, "-c", "from hfai.cli.workspace import keep_freed_memory\n"
                          "print(keep_freed_memory())"], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["True"], out.stderr


# ------------------------------------------------------------------------- hfai.protocol._lazy

LAZY = """
import dataclasses, importlib, json
from hfai.protocol import _lazy
import hfai.protocol.storage, hfai.protocol.waits
from hfai.protocol.messages import MESSAGE_TYPES
classes = list(MESSAGE_TYPES.values())
for ref in %r:
    module, name = ref.split(":")
    classes.append(getattr(importlib.import_module(module), name))
pending = [c.__name__ for c in classes if not _lazy.is_pending(c)]
for c in classes:
    _lazy.fields(c)  # read from its body first, so that making it compares the two
    _lazy.materialize(c)  # AdapterError where dataclass() added or found other than _lazy read
print(json.dumps({"count": len(classes), "made_before": pending,
                  "all_made": all(dataclasses.is_dataclass(c) and not _lazy.is_pending(c) for c in classes)}))
"""


def test_dataclasses_adds_and_finds_what_lazy_stands_in_for_for_every_class_it_defers():
    """Every lazily made class of the protocol and the CLI (tests/test_cli_speed_lazy.py names
    the others), made by the installed Python's dataclass() after _lazy read its fields."""
    from test_cli_speed_lazy import OTHERS

    out = _fresh(LAZY % (OTHERS,))
    assert out["count"] > 80 and out["made_before"] == [] and out["all_made"] is True


def _point():
    from hfai.protocol import _lazy

    class Point:
        KIND: ClassVar[str] = "point"
        x: int
        y: int = 0

    return _lazy.frozen_dataclass(Point)


def test_lazy_fails_loudly_where_dataclass_adds_a_name_it_does_not_stand_in_for(monkeypatch):
    from hfai.protocol import _lazy

    # As if a Python release added __repr__ (as 3.13 added __replace__): a pending class lacks it.
    monkeypatch.setattr(_lazy, "_NAMES", tuple(n for n in _lazy._NAMES if n != "__repr__"))
    P = _point()
    with pytest.raises(_lazy.AdapterError, match=r"adds __repr__, which hfai.protocol._lazy does not stand in for"):
        P(1)  # type: ignore[call-arg]  # its first instance past PLAIN_INITS, or any other use, makes it
        _lazy.materialize(P)


def test_lazy_fails_loudly_where_dataclass_finds_other_fields_than_it_read(monkeypatch):
    import dataclasses

    from hfai.protocol import _lazy

    P = _point()
    read = _lazy.fields(P)
    assert [f.name for f in read] == ["x", "y"]
    # As if dataclass() read a class body otherwise: what _lazy read no longer matches.
    changed = dataclasses.field(default=5)
    changed.name, changed.type = "y", "int"
    monkeypatch.setitem(_lazy._FIELDS, P, (read[0], changed))
    with pytest.raises(_lazy.AdapterError, match=r"read the fields of .*Point as"):
        _lazy.materialize(P)
