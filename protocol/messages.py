"""What every message of the hfai wire protocol shares: the registry of kinds
(:data:`MESSAGE_TYPES`), the :func:`message` decorator that registers a frozen dataclass under its
``kind`` tag, :func:`evolve`, and :class:`ErrorReply`, the refusal any request may get.

Every message is a frozen dataclass registered with a ``kind`` tag (``KIND`` class attribute);
:mod:`hfai.protocol.codec` turns them into msgpack and back. Field types are restricted to what the
codec understands: ``int``, ``float``, ``str``, ``bool``, ``bytes``, enums, ``X | None``,
``tuple[X, ...]``, ``dict[str, X]`` and nested message dataclasses. The messages live by domain
(jobs, nodes, runs, settings, storage); :mod:`hfai.protocol.types` names them all.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import ClassVar, TypeVar, dataclass_transform

from hfai.protocol._lazy import frozen_dataclass

_T = TypeVar("_T")


MESSAGE_TYPES: dict[str, type] = {}


def evolve(obj: _T, **changes) -> _T:
    """``dataclasses.replace`` for messages without ``__post_init__``, three times faster: the
    simulator replays hundreds of thousands of record changes. Unknown field names
    raise TypeError, as with ``replace``."""
    names = obj.__dataclass_fields__  # type: ignore[attr-defined]
    for k in changes:
        if k not in names:
            raise TypeError(f"{type(obj).__name__} has no field {k!r}")
    new = object.__new__(type(obj))
    d = new.__dict__
    d.update(obj.__dict__)
    d.update(changes)
    return new


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def message(kind: str) -> Callable[[type[_T]], type[_T]]:
    """Register a frozen dataclass as a wire message with the tag ``kind``."""

    def wrap(cls: type[_T]) -> type[_T]:
        cls = frozen_dataclass(cls)  # its methods made on first use (hfai.protocol._lazy)
        cls.KIND = kind  # type: ignore[attr-defined]  # every message class declares KIND: ClassVar[str]
        if kind in MESSAGE_TYPES:
            raise TypeError(f"duplicate message kind {kind!r}")
        MESSAGE_TYPES[kind] = cls
        return cls

    return wrap


@message("error_reply")
class ErrorReply:
    """A refusal. ``message`` is made one non-empty line of at most ``MESSAGE_LIMIT`` characters:
    errors often quote what the caller sent, which may be huge or hold line breaks, and a reply
    must still fit in one NATS message and in one line of the user's terminal."""

    KIND: ClassVar[str]
    code: str
    message: str
    # Which case of ``code`` this is, for a receiver that acts on it (an ``ErrorSub`` value of
    # hfai.protocol.errors; "" for none): ``message`` is for people and may be reworded.
    sub: str = ""

    MESSAGE_LIMIT: ClassVar[int] = 2000

    def __post_init__(self):
        if isinstance(self.message, str):
            text = " ".join(self.message.split()) or f"{self.code} error (no details)"
            if len(text) > self.MESSAGE_LIMIT:
                text = text[: self.MESSAGE_LIMIT - 1] + "…"
            if text != self.message:
                object.__setattr__(self, "message", text)

