"""Encoding in parts (codec.pack / encode_packed): the bytes encode() writes, from parts encoded
once; and the decoder's shortcuts for values that already have their declared type."""

from __future__ import annotations

import msgpack
import pytest
from test_fuzz_codec import SAMPLES

from hfai.protocol import PROTOCOL_VERSION, ProtocolError, codec, decode, encode
from hfai.protocol.types import (
    ErrorReply,
    GpuStat,
    JobSpec,
    NodeInfo,
    NodeRecord,
    NodesReply,
    NodeState,
    StopRequest,
)

GPU = GpuStat(index=0, name="H100", utilization=50.0, memory_used=1, memory_total=2, temperature=40.0, power_w=300.0)
NODE = NodeRecord(name="n0", group="g", address="a", ts=1.0, seq=1, gpus=(GPU, GPU))


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_packing_a_message_whole_or_in_parts_writes_the_bytes_encode_does(msg):
    assert codec.encode_packed(msg).data == encode(msg)
    fields = list(vars(msg))
    for name in fields[:1] + fields[-1:]:  # the first field, or the last, given as bytes already packed
        part = msgpack.packb(codec._to_wire(getattr(msg, name)))
        assert codec.encode_packed(msg, **{name: part}).data == encode(msg)


def test_a_page_spliced_from_packed_nodes_is_the_reply():
    infos = [NodeInfo(record=NODE, state=NodeState.UP, age_s=0.5, jobs=("j1",)),
             NodeInfo(record=NODE, state=NodeState.DOWN, age_s=40.0, reason="broken")]
    items = [codec.pack(i, record=codec.pack(i.record)) for i in infos]
    reply = codec.encode_packed(NodesReply(nodes=(), more=True), nodes=codec.pack_array(items))
    assert encode(reply) == encode(NodesReply(nodes=tuple(infos), more=True))  # encode hands it on
    assert decode(reply.data, NodesReply).nodes == tuple(infos)


def test_packing_refuses_fields_a_message_does_not_have():
    with pytest.raises(TypeError, match="no field 'nope'"):
        codec.pack(StopRequest(job="j"), nope=b"\xc0")
    with pytest.raises(TypeError):
        codec.encode_packed(codec.Encoded(b""))


def body_of(msg) -> dict:
    return msgpack.unpackb(encode(msg))["b"]


def envelope(kind: str, body: dict) -> bytes:
    return msgpack.packb({"k": kind, "v": list(PROTOCOL_VERSION), "b": body})


def test_values_of_another_type_than_declared_still_go_through_the_checks():
    gpu = body_of(GPU)
    for field, value in (("index", True), ("utilization", float("nan")), ("utilization", float("inf")),
                         ("name", 5), ("fatal", 1), ("memory_used", 1.0)):
        with pytest.raises(ProtocolError, match=f"gpu_stat.{field}: expected"):
            decode(envelope("gpu_stat", {**gpu, field: value}))
    assert decode(envelope("gpu_stat", {**gpu, "utilization": 50})).utilization == 50.0  # a whole number


def test_missing_fields_get_their_defaults_each_its_own():
    body = body_of(JobSpec(name="j", entrypoint=("t",), workdir="/w"))
    del body["env"], body["nodes"]
    a, b = decode(envelope("job_spec", body)), decode(envelope("job_spec", body))
    assert a == JobSpec(name="j", entrypoint=("t",), workdir="/w") and a.env == {} and a.env is not b.env


def test_a_message_that_normalises_itself_still_does_when_decoded():
    raw = envelope("error_reply", {"code": "invalid", "message": "two\nlines"})
    assert decode(raw, ErrorReply).message == "two lines"
