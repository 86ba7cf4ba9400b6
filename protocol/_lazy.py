"""Frozen dataclasses whose methods are made on first use.

``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` as source text and compiles it (six ``exec`` calls a class on
Python 3.11): about 1 ms a class, 40-60 ms for the protocol's forty-odd messages at every import,
in every hfai process. A CLI call decodes three or four of them, and that import was a third of
its wall time. :func:`frozen_dataclass` leaves the class as its body made it, with a placeholder
under each name ``dataclasses`` would add; the first lookup of any of them (an instance made,
``dataclasses.fields``, ``==``, ``repr``, ``hash``, an attribute set) removes the placeholders and
applies ``dataclass(frozen=True)`` to the class in place, so from then on it is exactly the frozen
dataclass it would have been.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any, TypeVar, dataclass_transform

_T = TypeVar("_T")

#: What ``dataclass(frozen=True)`` adds to a class (eq and match_args on, slots off).
_NAMES = (
    "__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__",
    "__dataclass_fields__", "__dataclass_params__", "__match_args__",
    *(("__replace__",) if sys.version_info >= (3, 13) else ()),
)
# Two threads may make the first instance of one class at once; dataclass() runs once.
_LOCK = threading.RLock()


class _Pending:
    """Stands under one of a class's dataclass names until the class is made a dataclass."""

    __slots__ = ("owner", "name")

    def __init__(self, owner: type, name: str) -> None:
        self.owner = owner
        self.name = name

    def __get__(self, obj: Any, objtype: type | None = None) -> Any:
        materialize(self.owner)
        return getattr(self.owner if obj is None else obj, self.name)


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def frozen_dataclass(cls: type[_T]) -> type[_T]:
    """``dataclass(frozen=True)(cls)``, done at the first use of the class rather than now."""
    pending = {name: _Pending(cls, name) for name in _NAMES if name not in cls.__dict__}
    for name, placeholder in pending.items():
        setattr(cls, name, placeholder)
    return cls


def is_pending(cls: type) -> bool:
    """Whether ``cls`` still waits for its dataclass methods."""
    return any(isinstance(cls.__dict__.get(name), _Pending) for name in _NAMES)


def materialize(cls: type[_T]) -> type[_T]:
    """Make ``cls`` the frozen dataclass it stands for now (once; later calls return at once)."""
    with _LOCK:
        mine = [name for name in _NAMES if isinstance(cls.__dict__.get(name), _Pending)]
        if mine:
            for name in mine:  # dataclass() adds only what the class does not define itself
                delattr(cls, name)
            dataclasses.dataclass(frozen=True)(cls)
    return cls
