"""The one msgpack codec of the hfai protocol.

Envelope: a msgpack map ``{"k": kind, "v": [major, minor], "b": body}``; the body is a map of the
dataclass's fields. Enums travel as their values, nested messages as maps, tuples as arrays.
A decoder accepts any older or equal major version and any minor version (unknown fields of a
newer minor are ignored, so minor bumps may only add fields with defaults); everything else —
garbage, an unknown kind, a missing field, a wrong type, a newer major — raises ProtocolError.

Decoding is bounded, because its input comes from anyone who may publish on a subject: at most
``MAX_MESSAGE_BYTES`` in all, strings of at most ``MAX_STR_BYTES``, containers nested no deeper
than msgpack's own stack allows, finite floats only, and every field checked against its declared
type all the way down, so a handler never sees a value of the wrong type. Every refusal is one
``ProtocolError`` whose message is a single non-empty line that quotes at most a short excerpt
of the offending value.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, overload

import msgpack

from hfai.protocol import _lazy
from hfai.protocol import types as t
from hfai.protocol._lazy import frozen_dataclass
from hfai.protocol.errors import ProtocolError

#: The version every envelope carries: a field added with a default bumps the minor, anything a
#: decoder of this major could not read bumps the major (see the module docstring).
PROTOCOL_VERSION = (1, 11)

# NATS delivers at most max_payload bytes (1 MiB by default; 8 MiB is the most NATS recommends),
# so nothing larger is a message we ever sent.
MAX_MESSAGE_BYTES = 8 * 1024 * 1024
# The kernel refuses a longer single argument or environment string (MAX_ARG_STRLEN), so no
# command line, environment or name we carry needs more; a reply that quotes such a string (an
# error naming it) still fits in one NATS message.
MAX_STR_BYTES = 128 * 1024
# How much of an offending value an error message quotes.
_SHOW_CHARS = 60

M = TypeVar("M")


def encode(msg: Any) -> bytes:
    """Serialise a registered message to bytes (an :class:`Encoded` one is already)."""
    if type(msg) is Encoded:
        return msg.data
    kind = getattr(type(msg), "KIND", None)
    if kind is None or t.MESSAGE_TYPES.get(kind) is not type(msg):
        raise TypeError(f"{type(msg).__name__} is not a registered hfai message")
    envelope = {"k": kind, "v": list(PROTOCOL_VERSION), "b": _to_wire(msg)}
    return msgpack.packb(envelope, use_bin_type=True)


# ------------------------------------------------------------------------- encoding in parts
# A reply made of many messages that change one at a time (a page of nodes: each node's heartbeat
# record is ~1.4 KB and changes every few seconds) is built from parts encoded once: pack() gives
# a message's bytes as they travel inside another, with fields given as bytes already packed, and
# encode_packed() wraps such a body in the envelope. The bytes are those encode() writes.


@frozen_dataclass
class Encoded:
    """A message already encoded (by :func:`encode_packed`), which :func:`encode` hands on as it
    is: a handler may return it wherever its reply would be encoded, a client send it wherever
    its request would be. ``kind``: the message's kind tag, which the envelope in ``data`` names."""

    data: bytes
    kind: str = ""

    def __repr__(self) -> str:  # not the bytes: a page is half a megabyte
        return f"Encoded({self.kind or 'message'}, {len(self.data)} bytes)"


def pack(msg: Any, **packed: bytes) -> bytes:
    """The msgpack bytes of message ``msg`` inside another message (no envelope). The fields named
    in ``packed`` are taken as given, bytes made by pack() or pack_array(); ``msg``'s own values of
    them are ignored."""
    if not packed:
        return msgpack.packb(_to_wire(msg), use_bin_type=True)
    keys = _FIELD_KEYS.get(type(msg)) or _field_keys(type(msg))
    if not packed.keys() <= keys.keys():
        raise TypeError(f"{type(msg).__name__} has no field {sorted(packed.keys() - keys.keys())[0]!r}")
    names = list(keys)
    if names[:len(packed)] == list(packed):
        # The packed fields come first (a node's record in its info): the others are packed as
        # one map, whose header gives way to the whole message's.
        rest = {name: _to_wire(getattr(msg, name)) for name in names[len(packed):]}
        tail = msgpack.packb(rest, use_bin_type=True)[len(_MAP_HEADERS[len(rest)]):]
        return b"".join([_MAP_HEADERS[len(keys)], *(keys[n] + raw for n, raw in packed.items()), tail])
    parts = [_MAP_HEADERS[len(keys)]]
    for name, key in keys.items():
        parts.append(key)
        raw = packed.get(name)
        parts.append(raw if raw is not None else msgpack.packb(_to_wire(getattr(msg, name)), use_bin_type=True))
    return b"".join(parts)


def pack_array(items: list[bytes]) -> bytes:
    """The msgpack array of ``items``, each already packed."""
    return _PACKER.pack_array_header(len(items)) + b"".join(items)


def encode_packed(msg: Any, **packed: bytes) -> Encoded:
    """``encode(msg)`` with some fields already packed (see :func:`pack`)."""
    kind = getattr(type(msg), "KIND", None)
    if kind is None or t.MESSAGE_TYPES.get(kind) is not type(msg):
        raise TypeError(f"{type(msg).__name__} is not a registered hfai message")
    head = _HEADS.get(kind)
    if head is None:
        head = _HEADS[kind] = b"".join([_MAP_HEADERS[3], *(msgpack.packb(x) for x in ("k", kind, "v")),
                                        msgpack.packb(list(PROTOCOL_VERSION)), msgpack.packb("b")])
    return Encoded(head + pack(msg, **packed), kind)


# Only for headers (each call returns its bytes and resets the packer; it runs under the GIL).
_PACKER = msgpack.Packer(use_bin_type=True)
_MAP_HEADERS = [_PACKER.pack_map_header(n) for n in range(64)]
_FIELD_KEYS: dict[type, dict[str, bytes]] = {}
_HEADS: dict[str, bytes] = {}


def _field_keys(tp: type) -> dict[str, bytes]:
    if not _lazy.is_dataclass(tp):
        raise TypeError(f"{tp.__name__} is not an hfai message")
    keys = _FIELD_KEYS[tp] = {f.name: msgpack.packb(f.name) for f in _lazy.fields(tp)}
    return keys


@overload
def decode(data: bytes | bytearray | memoryview | None, expect: type[M], *, max_bytes: int = ...) -> M: ...
@overload
def decode(data: bytes | bytearray | memoryview | None, expect: tuple[type, ...] | None = None, *,
           max_bytes: int = ...) -> Any: ...


def decode(data: bytes | bytearray | memoryview | None, expect: type | tuple[type, ...] | None = None, *,
           max_bytes: int = MAX_MESSAGE_BYTES) -> Any:
    """Parse bytes into a message; with ``expect``, also insist on its type(s). Anything else
    (None: a KV entry without a value) raises ProtocolError like garbage does. ``max_bytes``:
    more than one NATS message allows, only for what travels in pieces (a workspace manifest)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"not a msgpack message: got {type(data).__name__}, not bytes")
    if len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes is larger than the {max_bytes} "
                            "an hfai message may be")
    try:
        envelope = msgpack.unpackb(data, raw=False, strict_map_key=True, max_str_len=MAX_STR_BYTES,
                                   max_bin_len=MAX_MESSAGE_BYTES)
    except msgpack.exceptions.StackError:  # its message is empty
        raise ProtocolError("not a msgpack message: containers nested too deeply") from None
    except Exception as e:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(f"not a msgpack message: {_reason(e)}") from None
    if not isinstance(envelope, dict) or not {"k", "v", "b"} <= envelope.keys():
        raise ProtocolError("not an hfai message envelope (a map with k, v and b)")
    kind, version, body = envelope["k"], envelope["v"], envelope["b"]
    if not (isinstance(version, list) and len(version) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in version)
            and version[0] >= 1):
        raise ProtocolError(f"bad protocol version {_show(version)}")
    if version[0] > PROTOCOL_VERSION[0]:
        raise ProtocolError(
            f"message uses protocol {version[0]}.{version[1]}, this side speaks "
            f"{PROTOCOL_VERSION[0]}.{PROTOCOL_VERSION[1]}: upgrade hfai"
        )
    cls = t.MESSAGE_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message kind {_show(kind)}")
    try:
        msg = _from_wire(cls, body, kind)
    except ProtocolError:
        raise
    except Exception as e:  # whatever the checks let through must still not escape untyped
        raise ProtocolError(f"{kind}: cannot decode ({_reason(e)})") from None
    if expect is not None and not isinstance(msg, expect):
        want = expect.__name__ if isinstance(expect, type) else "/".join(c.__name__ for c in expect)
        raise ProtocolError(f"expected {want}, got {kind}")
    return msg


# ------------------------------------------------------------------------------------ internals

# Encoders and decoders are built once per type (the first message of a kind pays for reading its
# type hints); walking the type hints of every field of every message instead would cost each
# node record as much again, which a 1,000-node `hfai nodes` pays on every call.

_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})
_ENCODERS: dict[type, Any] = {}


def _to_wire(value: Any) -> Any:
    tp = type(value)
    if tp in _PLAIN:
        return value
    enc = _ENCODERS.get(tp)
    if enc is None:
        enc = _ENCODERS[tp] = _encoder(tp)
    return enc(value)


def _encoder(tp: type) -> Any:
    if _lazy.is_dataclass(tp):
        names = tuple(f.name for f in _lazy.fields(tp))

        def encode_fields(value: Any) -> Any:
            out = {}
            for name in names:
                v = getattr(value, name)
                out[name] = v if type(v) in _PLAIN else _to_wire(v)
            return out
        return encode_fields
    if issubclass(tp, enum.Enum):
        return lambda value: value.value
    if issubclass(tp, (tuple, list)):
        return lambda value: [v if type(v) in _PLAIN else _to_wire(v) for v in value]
    if issubclass(tp, dict):
        return lambda value: {k: _to_wire(v) for k, v in value.items()}
    return lambda value: value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The type of each of ``cls``'s fields (its annotations evaluated by typing.get_type_hints in
    its module, where a message imports the types it names), once per class."""
    return typing.get_type_hints(cls)


def _from_wire(cls: type, body: Any, where: str) -> Any:
    return _decoder(cls)(body, where)


def _convert(tp: Any, value: Any, where: str) -> Any:
    return _decoder(tp)(value, where)


_SCALARS: dict[type, tuple[type, ...]] = {int: (int,), float: (float, int), str: (str,), bool: (bool,), bytes: (bytes,)}
_Decoder = typing.Callable[[Any, str], Any]


@functools.cache
def _decoder(tp: Any) -> _Decoder:
    """The checking converter of wire values of type ``tp`` (see the module doc)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _union_decoder(tp)
    if origin is tuple:
        return _tuple_decoder(typing.get_args(tp)[0])
    if origin is dict:
        return _dict_decoder(*typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_decoder(tp)
    if isinstance(tp, type) and _lazy.is_dataclass(tp):
        return _dataclass_decoder(tp)
    return _scalar_decoder(tp)


def _union_decoder(tp: Any) -> _Decoder:
    args = typing.get_args(tp)
    inner = _decoder([a for a in args if a is not type(None)][0])
    if type(None) not in args:
        return inner

    def optional(value: Any, where: str) -> Any:
        return None if value is None else inner(value, where)
    return optional


def _tuple_decoder(item_tp: Any) -> _Decoder:
    item = _decoder(item_tp)
    # Items that are already what they must be (a tuple of names) pass without a call each.
    exact = {str: str, bytes: bytes, int: int}.get(item_tp)

    def array(value: Any, where: str) -> Any:
        if not isinstance(value, list):
            raise ProtocolError(f"{where}: expected an array")
        if exact is not None and all(type(v) is exact for v in value):
            return tuple(value)
        return tuple([item(v, f"{where}[{i}]") for i, v in enumerate(value)])  # a list: no generator frames
    return array


def _dict_decoder(key_tp: Any, val_tp: Any) -> _Decoder:
    key, val = _decoder(key_tp), _decoder(val_tp)

    def mapping(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            raise ProtocolError(f"{where}: expected a map")
        return {key(k, f"{where} key"): val(v, f"{where}[{_show(k)}]") for k, v in value.items()}
    return mapping


def _enum_decoder(tp: type[enum.Enum]) -> _Decoder:
    # Only values of the wire type of the enum's own values: an enum lookup of an unhashable value
    # (a list) raises TypeError, and True would pass for 1.
    members = {(type(m.value), m.value): m for m in tp}
    wire_types = {type(m.value) for m in tp}

    def member(value: Any, where: str) -> Any:
        m = members.get((type(value), value)) if type(value) in wire_types else None
        if m is None:
            raise ProtocolError(f"{where}: {_show(value)} is not a valid {tp.__name__}")
        return m
    return member


def _dataclass_decoder(cls: type) -> _Decoder:
    # (name, decoder, required, exact): a value whose type is ``exact`` is already what the
    # decoder would return, so it is taken without the call and without spelling its path (most
    # fields of a heartbeat are plain numbers and strings: ~100 per 8-GPU node).
    fields: list[tuple[str, _Decoder, Callable[[], Any] | None, type | None]] = []
    # A frozen dataclass's __init__ sets each field through object.__setattr__ (slow for a
    # message of many fields); a message without __post_init__ is filled in directly instead, as evolve() does,
    # and a class still pending (hfai.protocol._lazy) stays so: its fields are read without making
    # it, and a reply a command only prints never makes its dataclass methods.
    direct = not hasattr(cls, "__post_init__")
    finite: Callable[[Any], bool] = math.isfinite  # a local name (and no typing.cast call per float)

    def message(body: Any, where: str) -> Any:
        if not isinstance(body, dict):
            raise ProtocolError(f"{where}: expected a map for {cls.__name__}")
        if not fields:  # built on first use: a message type may contain itself
            hints = _hints(cls)
            fields.extend((f.name, _decoder(hints[f.name]), _default(f), _EXACT.get(hints[f.name]))
                          for f in _lazy.fields(cls))
        kwargs = {}
        for name, dec, default, exact in fields:
            if name in body:
                value = body[name]
                if type(value) is exact and (exact is not float or finite(value)):
                    kwargs[name] = value
                else:
                    kwargs[name] = dec(value, f"{where}.{name}")
            elif default is None:
                raise ProtocolError(f"{where}: missing field {name!r}")
            else:
                kwargs[name] = default()
        if not direct:
            return cls(**kwargs)
        out: Any = object.__new__(cls)
        out.__dict__.update(kwargs)
        return out
    return message


def _default(f: dataclasses.Field) -> Callable[[], Any] | None:
    """What makes a missing field's value, None for a required field."""
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    if f.default is not dataclasses.MISSING:
        value = f.default
        return lambda: value
    return None


# Declared types whose wire values of exactly that type decode to themselves (a float only when
# finite, see _scalar_decoder); bool is its own type, so an int never passes for it or it for one.
_EXACT: dict[Any, type] = {str: str, int: int, float: float, bool: bool, bytes: bytes}


def _scalar_decoder(tp: Any) -> _Decoder:
    accepted = _SCALARS.get(tp)
    if accepted is None:
        def unknown(value: Any, where: str) -> Any:
            raise TypeError(f"codec cannot handle field type {tp!r}")
        return unknown

    def scalar(value: Any, where: str) -> Any:
        if type(value) is tp and tp is not float:
            return value  # the common case: exactly the declared type (never bool for int)
        # bool is an int subclass in Python: keep them apart on the wire.
        if not isinstance(value, accepted) or (tp is not bool and isinstance(value, bool)):
            raise ProtocolError(f"{where}: expected {tp.__name__}, got {type(value).__name__}")
        # No field means "not a number" or "forever", and a NaN makes every comparison false.
        if isinstance(value, float) and not math.isfinite(value):
            raise ProtocolError(f"{where}: expected a finite number, got {value!r}")
        if tp is float and isinstance(value, int):
            return float(value)  # a whole number where a float is declared
        return value
    return scalar


def _show(value: Any) -> str:
    """A short one-line excerpt of a value for an error message (the value may be huge or hostile)."""
    text = repr(value)
    return text if len(text) <= _SHOW_CHARS else text[: _SHOW_CHARS - 1] + "…"


def _reason(e: Exception) -> str:
    """One non-empty line about an exception (some of msgpack's have an empty message)."""
    text = " ".join(str(e).split())
    if len(text) > 200:
        text = text[:199] + "…"
    return text or type(e).__name__
