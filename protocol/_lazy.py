"""Frozen dataclasses whose methods are made on first use.

``dataclasses`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` as source text and compiles it (six ``exec`` calls a class on
Python 3.11), for the protocol's forty-odd messages at every import, in every hfai process, while
a CLI call decodes three or four of them (docs/performance.md). :func:`frozen_dataclass` leaves
the class as its body made it, with a placeholder under each name ``dataclasses`` would add; the
first lookup of any of them (an instance made, ``dataclasses.fields``, ``==``, ``repr``,
``hash``, an attribute set) removes the placeholders and applies ``dataclass(frozen=True)`` to the
class in place, so from then on it is exactly the frozen dataclass it would have been.

An instance made of a pending class (``Point(1, y=2)``) is filled in as the dataclass's
``__init__`` would fill it (defaults, default factories, ``__post_init__``) without making the
class; anything else asked of it then makes the class, as above. A call the plain ``__init__``
would refuse (a wrong or missing argument) makes the class and gets the dataclass's own error.
Filling one in costs a few microseconds more than the dataclass's ``__init__``, so a class whose
instances are made by the hundred (a manifest's entries) is made after its first
``PLAIN_INITS``.

Code that only needs to know a class's fields (the codec decoding a reply into instances it makes
with ``object.__new__``, the config loader checking a file's keys) asks :func:`fields`, which reads
them from a pending class's body as ``dataclass()`` would, without making it: a CLI call then
makes only the classes whose instances it creates or compares.

An adapter (docs/performance.md, "the adapters kept"): it stands in for ``dataclasses`` until a
class is made, so it assumes two things of the installed Python, and a class made where either
no longer holds raises :class:`AdapterError` instead of going on subtly different:

* ``dataclass(frozen=True)`` adds exactly the names of ``_NAMES`` to a class (a new one, as
  3.13's ``__replace__``, would be missing from a pending class);
* the fields :func:`fields` read from a class's body are the ones ``dataclass()`` then finds.

tests/test_cli_startup_adapters.py checks both against the installed Python for every class the
protocol and a CLI call declare, and that each failure is loud.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import types
import typing
from collections.abc import Callable
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
        if obj is not None and self.name == "__init__":
            init = _plain_init(self.owner)
            if init is not None:  # a new instance: filled in without making the class
                return types.MethodType(init, obj)
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


class AdapterError(RuntimeError):
    """``dataclasses`` no longer does what this module assumes of it (see the module docstring):
    a Python upgrade this adapter must follow."""


def materialize(cls: type[_T]) -> type[_T]:
    """Make ``cls`` the frozen dataclass it stands for now (once; later calls return at once)."""
    with _LOCK:
        mine = [name for name in _NAMES if isinstance(cls.__dict__.get(name), _Pending)]
        if mine:
            for name in mine:  # dataclass() adds only what the class does not define itself
                delattr(cls, name)
            before = set(cls.__dict__)
            dataclasses.dataclass(frozen=True)(cls)
            _check(cls, set(cls.__dict__) - before)
    return cls


def _check(cls: type, added: set[str]) -> None:
    """Raise AdapterError where ``dataclass()``, having made ``cls`` (adding ``added``), did
    other than this module stood in for."""
    unknown = added - set(_NAMES)
    if unknown:
        raise AdapterError(f"dataclasses.dataclass() on Python {sys.version.split()[0]} adds "
                           f"{', '.join(sorted(unknown))}, which hfai.protocol._lazy does not stand in for "
                           f"(its _NAMES): a pending {cls.__qualname__} lacked them")
    read = _FIELDS.get(cls)
    if read is not None and _spec(read) != _spec(dataclasses.fields(cls)):
        raise AdapterError(f"hfai.protocol._lazy read the fields of {cls.__qualname__} as {_spec(read)}, "
                           f"dataclasses.dataclass() on Python {sys.version.split()[0]} as "
                           f"{_spec(dataclasses.fields(cls))}")


def _spec(found: tuple[dataclasses.Field, ...]) -> list[tuple]:
    """What of each field a pending class's instances and the codec rely on."""
    return [(f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.hash, f.compare) for f in found]


def is_dataclass(cls: type) -> bool:
    """``dataclasses.is_dataclass(cls)``, counting a pending class as one without making it."""
    return is_pending(cls) or dataclasses.is_dataclass(cls)


def fields(cls: type) -> tuple[dataclasses.Field, ...]:
    """``dataclasses.fields(cls)`` (name, type, default, default_factory of each field, in order),
    without making a pending class a dataclass. A class whose fields this does not read itself (a
    base class with fields, ``InitVar``, ``KW_ONLY``, ``field(init=False)`` or ``kw_only``, or a
    declaration ``dataclass()`` would refuse) is made, and ``dataclasses`` answers."""
    if is_pending(cls):
        found = _FIELDS.get(cls)
        if found is None:
            found = _read_fields(cls)
            if found is None:
                materialize(cls)
                return dataclasses.fields(cls)
            _FIELDS[cls] = found
        return found
    return dataclasses.fields(cls)


#: The fields :func:`fields` read from a pending class's body, by class.
_FIELDS: dict[type, tuple[dataclasses.Field, ...]] = {}


def _read_fields(cls: type) -> tuple[dataclasses.Field, ...] | None:
    if any(hasattr(base, "__dataclass_fields__") for base in cls.__mro__[1:]):
        return None  # inherited fields come first, as that base orders them: dataclasses knows
    if "__slots__" in cls.__dict__:
        return None
    out: list[dataclasses.Field] = []
    defaulted = False
    for name, annotation in cls.__dict__.get("__annotations__", {}).items():
        kind = _annotation_kind(annotation)
        if kind == "classvar":
            continue
        if kind != "field":
            return None
        value = cls.__dict__.get(name, dataclasses.MISSING)
        if isinstance(value, dataclasses.Field):
            if not value.init or value.kw_only is True:
                return None
            made: Any = dataclasses.field(default=value.default, default_factory=value.default_factory,
                                          repr=value.repr, hash=value.hash, compare=value.compare,
                                          metadata=value.metadata)
        elif value is dataclasses.MISSING:
            made = dataclasses.field()
        elif type(value).__hash__ is None:
            return None  # a mutable default: dataclass() raises ValueError
        else:
            made = dataclasses.field(default=value)
        f: dataclasses.Field = made  # field() is typed as the default's type for the class body
        has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
        if defaulted and not has_default:
            return None  # a required field after one with a default: dataclass() raises TypeError
        defaulted = defaulted or has_default
        f.name, f.type = name, annotation
        out.append(f)
    return tuple(out)


def _annotation_kind(annotation: Any) -> str:
    """"classvar", "field", or "other" (InitVar, KW_ONLY or a string this does not read)."""
    if isinstance(annotation, str):
        head = annotation.split("[", 1)[0].strip()
        if head in ("ClassVar", "typing.ClassVar"):
            return "classvar"
        # dataclasses reads these names out of the string too: leave them to it.
        return "other" if any(word in annotation for word in ("ClassVar", "InitVar", "KW_ONLY")) else "field"
    if annotation is typing.ClassVar or typing.get_origin(annotation) is typing.ClassVar:
        return "classvar"
    if annotation is dataclasses.KW_ONLY or isinstance(annotation, dataclasses.InitVar) \
            or annotation is dataclasses.InitVar:
        return "other"
    return "field"


#: Instances of a pending class filled in before the class is made (from then on its own
#: ``__init__``, a little faster each, makes them): making it costs about as much as 300 of them.
PLAIN_INITS = 64

#: The plain ``__init__`` of each pending class :func:`_plain_init` could write one for.
_INITS: dict[type, Callable[..., None]] = {}


def _plain_init(cls: type) -> Callable[..., None] | None:
    """An ``__init__`` for instances of pending ``cls`` that fills their fields as the frozen
    dataclass's would, or None where :func:`fields` would make the class to know them."""
    init = _INITS.get(cls)
    if init is None and is_pending(cls):
        specs = _FIELDS.get(cls) or _read_fields(cls)
        if specs is not None:
            _FIELDS[cls] = specs
            init = _INITS[cls] = _make_init(cls, specs)
    return init


def _make_init(cls: type, specs: tuple[dataclasses.Field, ...]) -> Callable[..., None]:
    names = tuple(f.name for f in specs)
    known = frozenset(names)
    fill = tuple((f.name, f.default, f.default_factory) for f in specs)
    post_init = hasattr(cls, "__post_init__")
    missing = dataclasses.MISSING
    made = [0]

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        made[0] += 1
        if made[0] >= PLAIN_INITS:
            materialize(cls)  # later instances get the dataclass's own __init__; this one is filled below
        if len(args) > len(names) or not known.issuperset(kwargs) or not kwargs.keys().isdisjoint(names[:len(args)]):
            return _dataclass_init(cls, self, args, kwargs)  # its TypeError, word for word
        given = dict(zip(names, args, strict=False), **kwargs)
        values = {}
        for name, default, factory in fill:  # in field order, as the dataclass sets them
            if name in given:
                values[name] = given[name]
            elif default is not missing:
                values[name] = default
            elif factory is not missing:
                values[name] = factory()
            else:
                return _dataclass_init(cls, self, args, kwargs)
        self.__dict__.update(values)
        if post_init:
            self.__post_init__()

    return __init__


def _dataclass_init(cls: type, obj: Any, args: tuple, kwargs: dict) -> None:
    materialize(cls)
    cls.__init__(obj, *args, **kwargs)  # type: ignore[misc]
