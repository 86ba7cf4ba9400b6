"""What keeps a CLI call from making dataclasses it only reads (each costs it 1-3 ms): the fields
hfai.protocol._lazy reads from a pending class's body are the ones dataclasses finds, an instance it
fills in is the one the dataclass's __init__ makes, a decoded reply and a loaded config make no
class until something asks for more than their fields, and what they hold is what it was before.

Each check runs in a fresh interpreter: in this one, other tests have made the classes already."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from typing import ClassVar

import pytest

from hfai.protocol import _lazy

#: The lazily made classes a CLI call meets (the protocol's messages are listed by MESSAGE_TYPES).
OTHERS = ("hfai.core.config:NatsConfig", "hfai.core.config:ControllerConfig", "hfai.core.config:AgentConfig",
          "hfai.core.config:WebConfig", "hfai.core.config:StorageConfig", "hfai.core.config:DevConfig",
          "hfai.api.client:JobFilter", "hfai.api.arrays:Target", "hfai.cli.render:QuotaUse",
          "hfai.core.nats:Buckets", "hfai.protocol.reasons:Reason", "hfai.core.config:Config",
          "hfai.auth.roles:Permissions")


def run(code: str) -> str:
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


CLASSES = f"""
import dataclasses, importlib
from hfai.protocol import _lazy
from hfai.protocol.types import MESSAGE_TYPES
classes = list(MESSAGE_TYPES.values())
for ref in {OTHERS!r}:
    module, name = ref.split(":")
    classes.append(getattr(importlib.import_module(module), name))
assert all(_lazy.is_pending(c) for c in classes), [c for c in classes if not _lazy.is_pending(c)]
def spec(fields):
    return [(f.name, f.type, repr(f.default), f.default_factory, f.repr, f.hash, f.compare) for f in fields]
"""


def test_fields_read_from_a_pending_class_are_the_dataclass_fields():
    out = run(CLASSES + """
read = {c: spec(_lazy.fields(c)) for c in classes}
assert all(_lazy.is_pending(c) for c in classes), "fields() made a class"
bad = [c.__name__ for c in classes if read[c] != spec(dataclasses.fields(_lazy.materialize(c)))]
print(len(classes), bad)
""")
    count, bad = out.split(" ", 1)
    assert int(count) > 40 and eval(bad) == []


def test_an_instance_of_a_pending_class_is_the_one_its_dataclass_makes():
    """Every class, its required fields given (positionally and by name), the rest defaulted:
    the same field values in the same order, the class still pending; the dataclass then made
    by a repr, equal to one its own __init__ made."""
    out = run(CLASSES + """
import hfai.protocol.types as t
bad = []
for c in classes:
    required = [f.name for f in _lazy.fields(c)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    values = {name: f"v-{name}" for name in required}
    if c is t.ErrorReply:
        values = {"code": "x", "message": "two\\nlines"}  # its __post_init__ makes one line
    args = list(values.values())[:1]
    kwargs = dict(list(values.items())[1:])
    fast = c(*args, **kwargs)
    still = _lazy.is_pending(c)
    text = repr(fast)
    real = c(*args, **kwargs)
    if not (still and list(vars(fast).items()) == list(vars(real).items()) and fast == real
            and text == repr(real)):
        bad.append(c.__name__)
print(bad)
""")
    assert eval(out) == []


def make_point(decorate=_lazy.frozen_dataclass):
    class Point:
        KIND: ClassVar[str] = "point"
        x: int
        y: int = 0
        extra: tuple[int, ...] = dataclasses.field(default_factory=tuple)

    return decorate(Point)


@pytest.mark.parametrize("call", ["()", "(1, 2, (), 4)", "(1, z=3)", "(1, x=1)"])
def test_a_call_the_dataclass_refuses_gets_its_own_error(call):
    P = make_point()
    with pytest.raises(TypeError) as lazy_error:
        eval(f"P{call}")
    assert not _lazy.is_pending(P)  # made, to give the dataclass's error
    Q = make_point(dataclasses.dataclass(frozen=True))  # noqa: F841  (named in the eval)
    with pytest.raises(TypeError) as real_error:
        eval(f"Q{call}")
    assert str(lazy_error.value) == str(real_error.value)


def test_a_post_init_runs_and_may_refuse():
    from hfai.api.client import JobFilter
    from hfai.protocol.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        JobFilter.of(states=["no-such-state"])
    assert JobFilter.of(states=["Running "]).states == ("running",)


def test_unusual_declarations_are_left_to_dataclasses():
    """An inherited field, a field(init=False) or a mutable default: fields() makes the class,
    and dataclass() raises where it would have."""

    class Base:
        a: int = 1

    Base = _lazy.frozen_dataclass(dataclasses.dataclass(frozen=True)(Base))

    class Child(Base):
        b: int = 2

    Child = _lazy.frozen_dataclass(Child)
    assert [f.name for f in _lazy.fields(Child)] == ["a", "b"] and not _lazy.is_pending(Child)

    class Hidden:
        a: int = 1
        b: int = dataclasses.field(default=2, init=False)

    Hidden = _lazy.frozen_dataclass(Hidden)
    assert Hidden().b == 2 and not _lazy.is_pending(Hidden)

    class Mutable:
        a: list = []  # noqa: RUF012  (the mistake this checks)

    Mutable = _lazy.frozen_dataclass(Mutable)
    with pytest.raises(ValueError, match="mutable default"):
        _lazy.fields(Mutable)


def test_a_decoded_reply_makes_no_class_and_equals_what_was_sent():
    out = run("""
from hfai.protocol import _lazy, decode, encode
from hfai.protocol.types import MESSAGE_TYPES, ChainState, JobEvent, JobList, JobRecord, JobSpec
from hfai.protocol.reasons import Reason
spec = JobSpec(name="a", entrypoint=("python", "t.py"), workdir="/w", env={"K": "V"})
rec = JobRecord(id="j1", spec=spec, state=ChainState.RUNNING, submit_ts=1.5, nodes=("n0",),
                history=(JobEvent(ts=1.0, state=ChainState.QUEUED, why=Reason("submitted", {"by": "u"})),))
sent = JobList(jobs=(rec, rec), more=False)
got = decode(encode(sent), JobList)
made = sorted(c.__name__ for c in MESSAGE_TYPES.values() if not _lazy.is_pending(c))
print(repr(made), got.jobs[1].history[0].why.params["by"], got == sent)
""")
    made, by, equal = out.split()
    assert eval(made) == [] and by == "u" and equal == "True"


def test_a_loaded_config_checks_every_section_and_makes_each_at_its_first_read(tmp_path):
    from hfai.core.config import Config, dump_toml

    path = tmp_path / "hfai.toml"
    path.write_text(dump_toml(Config()).replace("slice_s = 1800.0", "slice_s = 60"))
    out = run(f"""
import json, os
from hfai.core.config import _SECTIONS, Config, load_config
from hfai.protocol import _lazy
os.environ["HFAI_AGENT_SIM_GPUS"] = "3"
c = load_config({str(path)!r})
pending = sorted(n for n, cls in _SECTIONS.items() if _lazy.is_pending(cls))
print(json.dumps([pending, c.controller.slice_s, c.agent.sim_gpus, c.agent == Config().agent]))
""")
    pending, slice_s, gpus, agent_is_default = json.loads(out)
    assert pending == sorted(["nats", "controller", "agent", "web", "storage", "dev"])  # all checked, none made
    assert (slice_s, gpus, agent_is_default) == (60.0, 3, False)


@pytest.mark.parametrize("text, error", [("[dev]\nno_such_key = 1\n", "unknown keys: no_such_key"),
                                         ("[agent]\nsim_gpus = 'many'\n", "is not a int")])
def test_a_bad_section_is_refused_at_load_even_though_it_is_made_later(tmp_path, text, error):
    from hfai.core.config import load_config
    from hfai.protocol.errors import InvalidRequest

    path = tmp_path / "hfai.toml"
    path.write_text(text)
    with pytest.raises(InvalidRequest, match=error):
        load_config(path, env={})


def test_the_config_sections_are_read_back_as_given(tmp_path):
    from hfai.core.config import Config, NatsConfig, dump_toml, load_config

    want = dataclasses.replace(Config(), nats=NatsConfig(url="nats://h:1", request_copies=3))
    path = tmp_path / "hfai.toml"
    path.write_text(dump_toml(want))
    assert load_config(path, env={}) == want
    assert json.loads(json.dumps(dataclasses.asdict(load_config(path, env={})))) == dataclasses.asdict(want)


def test_a_class_made_in_numbers_gets_its_own_init_after_the_first_few():
    P = make_point()
    first = [P(i) for i in range(_lazy.PLAIN_INITS - 1)]
    assert _lazy.is_pending(P)
    more = [P(i) for i in range(_lazy.PLAIN_INITS - 1, 2 * _lazy.PLAIN_INITS)]
    assert not _lazy.is_pending(P) and P.__init__.__qualname__.endswith("Point.__init__")
    assert [p.x for p in first + more] == list(range(2 * _lazy.PLAIN_INITS)) and first[3] == P(3)


def test_the_codec_finds_each_fields_type_as_get_type_hints_does_in_the_messages_own_module():
    """hfai.protocol.codec takes each field's type from typing.get_type_hints, in the class's own
    module, with no namespace standing in: every message's module imports what its annotations
    name, and what the codec decodes by is what typing finds."""
    import typing

    import hfai.protocol.storage as storage_messages
    import hfai.protocol.waits as wait_messages
    from hfai.protocol import codec
    from hfai.protocol import types as t

    classes = {c for module in (t, storage_messages, wait_messages) for c in vars(module).values()
               if isinstance(c, type) and _lazy.is_dataclass(c)}
    assert len(classes) > 60
    for cls in classes:
        full = typing.get_type_hints(cls)
        found = codec._hints.__wrapped__(cls)
        assert {f.name: found[f.name] for f in _lazy.fields(cls)} == {f.name: full[f.name] for f in _lazy.fields(cls)}
