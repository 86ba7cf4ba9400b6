"""hfai.protocol._lazy: a message class is a frozen dataclass from its first use on, and not before."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
import threading
from typing import ClassVar

import pytest

from hfai.protocol import _lazy
from hfai.protocol.types import MESSAGE_TYPES


def make(name: str = "Point"):
    """A fresh class each time (a class is made a dataclass once), as the protocol declares them."""

    class Point:
        KIND: ClassVar[str] = "point"
        x: int
        y: int = 0
        tags: tuple[str, ...] = ()
        extra: tuple[int, ...] = dataclasses.field(default_factory=tuple)

    Point.__name__ = Point.__qualname__ = name
    return _lazy.frozen_dataclass(Point)


def reference():
    @dataclasses.dataclass(frozen=True)
    class Point:
        KIND: ClassVar[str] = "point"
        x: int
        y: int = 0
        tags: tuple[str, ...] = ()
        extra: tuple[int, ...] = dataclasses.field(default_factory=tuple)

    return Point


# pickle finds a class by its module and name
Pickled = make("Pickled")


def test_pending_until_first_use_then_a_plain_frozen_dataclass():
    P = make()
    assert _lazy.is_pending(P)
    p = P(1, tags=("a",))
    assert _lazy.is_pending(P)  # an instance is filled in as __init__ would, without making the class
    ref = reference()
    r = ref(1, tags=("a",))
    assert (p.x, p.y, p.tags, p.extra) == (r.x, r.y, r.tags, r.extra) and vars(p) == vars(r)
    assert repr(p) == repr(r).replace("reference.<locals>.", "")
    assert not _lazy.is_pending(P)
    assert [f.name for f in dataclasses.fields(P)] == [f.name for f in dataclasses.fields(ref)]
    assert P.__match_args__ == ref.__match_args__ == ("x", "y", "tags", "extra")
    assert P.__dataclass_params__.frozen
    for name in ("__init__", "__repr__", "__eq__", "__hash__", "__setattr__", "__delattr__"):
        assert not isinstance(P.__dict__[name], _lazy._Pending)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.x = 2  # type: ignore[misc]


@pytest.mark.parametrize("first_use", ["fields", "is_dataclass", "hash", "eq", "repr", "setattr", "delattr",
                                       "replace", "asdict", "match", "pickle", "copy", "subclass"])
def test_any_first_use_makes_the_dataclass(first_use):
    """The codec makes instances without __init__ (object.__new__ and the field values), so any
    dataclass behaviour may be the first one asked of a class."""
    P = Pickled if first_use == "pickle" else make()
    if first_use == "pickle" and not _lazy.is_pending(P):
        pytest.skip("the module's class was already used")
    raw = object.__new__(P)
    raw.__dict__.update(x=1, y=2, tags=(), extra=())
    if first_use == "fields":
        assert [f.name for f in dataclasses.fields(P)] == ["x", "y", "tags", "extra"]
    elif first_use == "is_dataclass":
        assert dataclasses.is_dataclass(P) and dataclasses.is_dataclass(raw)
    elif first_use == "hash":
        assert hash(raw) == hash(P(1, 2)) == hash((1, 2, (), ()))
    elif first_use == "eq":
        assert raw == P(1, 2) and raw != P(1, 3)
    elif first_use == "repr":
        assert repr(raw).endswith("(x=1, y=2, tags=(), extra=())")
    elif first_use == "setattr":
        with pytest.raises(dataclasses.FrozenInstanceError):
            raw.x = 5  # type: ignore[misc]
    elif first_use == "delattr":
        with pytest.raises(dataclasses.FrozenInstanceError):
            del raw.x  # type: ignore[misc]
    elif first_use == "replace":
        assert dataclasses.replace(raw, y=7) == P(1, 7)
    elif first_use == "asdict":
        assert dataclasses.asdict(raw) == {"x": 1, "y": 2, "tags": (), "extra": ()}
    elif first_use == "match":
        match raw:
            case P(a, b):  # positional: __match_args__
                assert (a, b) == (1, 2)
            case _:
                pytest.fail("no match")
    elif first_use == "pickle":
        assert pickle.loads(pickle.dumps(raw)) == P(1, 2)
    elif first_use == "copy":
        assert copy.deepcopy(raw) == P(1, 2)
    elif first_use == "subclass":
        @dataclasses.dataclass(frozen=True)
        class Q(P):  # type: ignore[valid-type, misc]
            z: int = 3

        assert Q(1).z == 3 and [f.name for f in dataclasses.fields(Q)] == ["x", "y", "tags", "extra", "z"]
    assert not _lazy.is_pending(P)


def test_what_the_class_defines_itself_stays():
    class Own:
        KIND: ClassVar[str] = "own"
        x: int

        def __repr__(self) -> str:
            return "mine"

        def __post_init__(self) -> None:
            if self.x < 0:
                raise ValueError("negative")

    _lazy.frozen_dataclass(Own)
    assert "__repr__" in Own.__dict__ and not isinstance(Own.__dict__["__repr__"], _lazy._Pending)
    assert repr(Own(1)) == "mine"  # type: ignore[call-arg]
    with pytest.raises(ValueError):
        Own(-1)  # type: ignore[call-arg]


def test_threads_making_the_first_instances_at_once():
    P = make()
    out: list[object] = []
    start = threading.Barrier(8)

    def first() -> None:
        start.wait()
        out.append(P(1))

    threads = [threading.Thread(target=first) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(out) == 8 and len(set(out)) == 1  # equal and hashable: one dataclass, made once


def test_every_message_type_is_a_valid_frozen_dataclass():
    """A field declared wrong (a default before a required field) fails at first use, not at
    import: this makes every message at once, so it still fails here."""
    for kind, cls in MESSAGE_TYPES.items():
        _lazy.materialize(cls)
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, kind
        assert not _lazy.is_pending(cls)


def test_importing_the_codec_makes_no_message_class():
    code = ("import hfai.protocol.codec, hfai.protocol.types as t, hfai.protocol._lazy as l; "
            "print(sum(not l.is_pending(c) for c in t.MESSAGE_TYPES.values()), len(t.MESSAGE_TYPES))")
    made, total = map(int, subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                          check=True).stdout.split())
    assert total > 30 and made == 0
