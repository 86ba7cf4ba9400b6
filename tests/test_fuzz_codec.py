"""The codec under garbage: whatever the bytes, decode returns a message whose every field has its
declared type, or raises ProtocolError with one short non-empty line. Seeded, so a failure repeats."""

from __future__ import annotations

import dataclasses
import enum
import math
import random
import sys
import types
import typing

import msgpack
import pytest
from fuzzing import mutate

from hfai.protocol import ProtocolError, codec, decode, encode
from hfai.protocol import types as t
from hfai.protocol.types import (
    MESSAGE_TYPES,
    ChainState,
    DesiredRun,
    DrainedNodes,
    DrainRequest,
    ErrorReply,
    GpuStat,
    HostStat,
    JobEvent,
    JobList,
    JobRecord,
    JobSpec,
    LeaderLease,
    LogChunk,
    LogRequest,
    NodeAssignment,
    NodeInfo,
    NodeRecord,
    NodesReply,
    NodeState,
    QuotaEntry,
    QuotaSetRequest,
    QuotaTable,
    RunAssignment,
    RunEvent,
    RunEventKind,
    SettingsReply,
    StopRequest,
    SubmitRequest,
)

SPEC = JobSpec(name="mnist", entrypoint=("python", "t.py"), workdir="/w", env={"A": "1"}, user="u")
RA = RunAssignment(job_id="j1", run_id=2, name="mnist", user="u", group="default", priority=30, rank=1,
                   world_size=2, master_addr="10.0.0.1", master_port=20001, entrypoint=("python", "t.py"),
                   workdir="/w", desired=DesiredRun.SUSPEND, env={"A": "1"})
NODE = NodeRecord(name="n0", group="default", address="a", ts=1.0, seq=3,
                  gpus=(GpuStat(index=0, name="H", utilization=1.0, memory_used=1, memory_total=2,
                                temperature=30.0, power_w=10.0),),
                  host=HostStat(cpu_percent=1.0, memory_used=1, memory_total=2, load1=0.5))
SAMPLES = [
    JobRecord(id="j1", spec=SPEC, state=ChainState.RUNNING, submit_ts=1.0, nodes=("n0",), exits={"n0": 0},
              history=(JobEvent(ts=1.0, state=ChainState.QUEUED, reason="r"),)),
    NodeAssignment(node="n0", fence=4, runs=(RA,)),
    NodesReply(nodes=(NodeInfo(record=NODE, state=NodeState.UP, age_s=0.1, jobs=("j1",)),)),
    LogRequest(job_id="j1", rank=0),
    LogChunk(data=b"log\n", offset=0, size=4),
    StopRequest(job="j1"),
    ErrorReply(code="invalid", message="no"),
    SubmitRequest(spec=SPEC),
    JobList(jobs=(JobRecord(id="j2", spec=SPEC, state=ChainState.QUEUED, submit_ts=2.0),), more=True),
    RunEvent(event=RunEventKind.EXITED, node="n0", job_id="j1", run_id=1, ts=1.0, exit_code=-9),
    SettingsReply(quotas=QuotaTable(entries=(QuotaEntry(user="u", priority=10, group="*", nodes=2),)),
                  drained=DrainedNodes(nodes={"n1": "broken"})),
    QuotaSetRequest(entry=QuotaEntry(user="u", priority=10, group="*", nodes=2)),
    DrainRequest(node="n0", reason="r"),
    LeaderLease(holder="c0", since=1.0),
]
# One default-constructed (or sample) instance of every registered kind, so all of them get fuzzed.
for _cls in MESSAGE_TYPES.values():
    if not any(type(s) is _cls for s in SAMPLES):
        try:
            SAMPLES.append(_cls())
        except TypeError:
            pass

HOSTILE = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, math.nan, math.inf, -math.inf, "",
           "x", "\0", "\x1b[2J", "../..", "/", "ü训练", "a" * 1000, b"", b"\xff\0", [], [1, "a"], {}, {"k": 1},
           {"": None}, [[[[[]]]]], msgpack.ExtType(5, b"x")]


def assert_typed(value, tp, where="msg"):
    """Every field of a decoded message holds exactly its declared type, all the way down."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            assert type(None) in typing.get_args(tp), where
            return
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        origin = typing.get_origin(tp)
    if origin is tuple:
        assert isinstance(value, tuple), where
        for i, v in enumerate(value):
            assert_typed(v, typing.get_args(tp)[0], f"{where}[{i}]")
    elif origin is dict:
        assert isinstance(value, dict), where
        for k, v in value.items():
            assert type(k) is str, where
            assert_typed(v, typing.get_args(tp)[1], f"{where}[{k!r}]")
    elif dataclasses.is_dataclass(tp):
        assert type(value) is tp, where
        # Its own module's names: a storage message's fields name hfai.protocol.storage's classes.
        hints = typing.get_type_hints(tp, {**vars(t), **vars(sys.modules[tp.__module__])})
        for f in dataclasses.fields(tp):
            assert_typed(getattr(value, f.name), hints[f.name], f"{where}.{f.name}")
    elif isinstance(tp, type) and issubclass(tp, enum.Enum):
        assert type(value) is tp, where
    else:
        assert type(value) is tp, f"{where}: {type(value).__name__} is not {tp.__name__}"
        if tp is float:
            assert math.isfinite(value), where


def check(data: bytes):
    try:
        msg = decode(data)
    except ProtocolError as e:
        text = str(e)
        assert text and "\n" not in text and "\r" not in text, repr(text)
        assert len(text) < 600, text[:200]
        return None
    assert_typed(msg, type(msg))
    return msg


def test_mutated_messages_decode_typed_or_fail_typed():
    rng = random.Random(20240607)
    for _ in range(6000):
        sample = rng.choice(SAMPLES)
        wire = msgpack.unpackb(encode(sample))
        for _ in range(rng.randint(1, 3)):
            wire = mutate(rng, wire, HOSTILE)
        check(msgpack.packb(wire, use_bin_type=True))


def test_random_and_truncated_bytes():
    rng = random.Random(7)
    for _ in range(3000):
        data = encode(rng.choice(SAMPLES))
        roll = rng.random()
        if roll < 0.3:
            data = data[: rng.randrange(len(data))]
        elif roll < 0.6:
            i = rng.randrange(len(data))
            data = data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]
        else:
            data = rng.randbytes(rng.randrange(64))
        check(data)


@pytest.mark.parametrize("data, text", [
    (b"\x91" * 5000 + b"\x00", "nested too deeply"),
    (msgpack.packb({"k": "stop_request", "v": [1, 1], "b": {"job": [[[[[[[[[[]]]]]]]]]]}}), "expected str"),
    (msgpack.packb({"k": "stop_request", "v": [1, 1], "b": {"job": "x" * (codec.MAX_STR_BYTES + 1)}}), "msgpack"),
    (b"\xdb\x7f\xff\xff\xff", "msgpack"),  # a str header claiming 2 GiB, and nothing behind it
    (b"\x00" * (codec.MAX_MESSAGE_BYTES + 1), "larger than"),
    (msgpack.packb({"k": "log_request", "v": [1, 1], "b": {"job_id": "j", "rank": math.nan}}), "expected int"),
    (msgpack.packb({"k": "list_request", "v": [1, 1], "b": {"after_ts": math.nan}}), "finite"),
    (msgpack.packb({"k": "list_request", "v": [1, 1], "b": {"after_ts": -math.inf}}), "finite"),
    (msgpack.packb({"k": "log_request", "v": [1, 1], "b": {"job_id": "j", "rank": 1.0}}), "expected int"),
    (msgpack.packb({"k": "job_event", "v": [1, 1], "b": {"ts": 1.0, "state": ["queued"]}}), "ChainState"),
    (msgpack.packb({"k": "job_event", "v": [1, 1], "b": {"ts": 1.0, "state": {"a": 1}}}), "ChainState"),
    (msgpack.packb({"k": "job_event", "v": [1, 1], "b": {"ts": 1.0, "state": 1}}), "ChainState"),
    (msgpack.packb({"k": "drained_nodes", "v": [1, 1], "b": {"nodes": {b"n": "x"}}}), "expected str"),
    (msgpack.packb({"k": "drained_nodes", "v": [1, 1], "b": {"nodes": {1: "x"}}, }, strict_types=False), "msgpack"),
    (msgpack.packb({"k": "stop_request", "v": [True, 0], "b": {"job": "a"}}), "version"),
    (msgpack.packb({"k": "stop_request", "v": [0, 0], "b": {"job": "a"}}), "version"),
    (msgpack.packb({"k": "stop_request", "v": [1, 2**64 - 1], "b": {"job": "a"}}), None),
    (msgpack.packb({"k": "x" * 100000, "v": [1, 1], "b": {}}), "unknown message kind"),
    (msgpack.packb({"k": "stop_request", "v": list(range(100000)), "b": {}}), "version"),
    (msgpack.packb({"k": "stop_request", "v": [1, 1], "b": {"job": "a"}}) + b"\x00", "msgpack"),
    (msgpack.packb({"k": "stop_request", "v": [1, 1], "b": {"job": "\udcff"}}, unicode_errors="surrogatepass"),
     "msgpack"),
    (msgpack.packb({"k": "stop_request", "v": [1, 1], "b": {"job": msgpack.ExtType(1, b"")}}), "expected str"),
    (msgpack.packb({"k": "stop_request", "v": [1, 1], "b": {"job": "a", "extra": [[[[1]]]]}}), None),
])
def test_each_hostile_shape_gets_a_short_typed_error(data, text):
    if text is None:
        assert check(data) is not None
        return
    with pytest.raises(ProtocolError) as info:
        decode(data)
    message = str(info.value)
    assert text in message and message.strip() and "\n" not in message and len(message) < 400, message[:300]


def test_error_replies_are_one_bounded_line():
    e = ErrorReply(code="not_found", message="no job with id or name '" + "\\x00" * 100000 + "'\nsecond line")
    assert "\n" not in e.message and len(e.message) <= ErrorReply.MESSAGE_LIMIT
    assert decode(encode(e)) == e
    assert ErrorReply(code="internal", message="").message  # never empty
    assert ErrorReply(code="x", message="fine").message == "fine"


def test_unicode_and_paths_in_strings_round_trip():
    for text in ("ü训练", "../..", "/etc/passwd", "a\0b", "\x1b[2J"):
        assert decode(encode(StopRequest(job=text))) == StopRequest(job=text)
