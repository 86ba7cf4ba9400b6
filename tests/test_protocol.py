"""The wire contract: golden bytes, round trips, and typed errors for every kind of bad input."""

from __future__ import annotations

import msgpack
import pytest

from hfai.protocol import PROTOCOL_VERSION, ProtocolError, decode, encode, names
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import (
    MESSAGE_TYPES,
    ChainState,
    DesiredRun,
    JobRecord,
    JobSpec,
    ListRequest,
    NodeAssignment,
    Priority,
    RunAssignment,
    RunEvent,
    RunEventKind,
    StopRequest,
)

SPEC = JobSpec(name="mnist", entrypoint=("python", "train.py"), workdir="/home/a", nodes=2, priority=30, user="alice")


def test_golden_bytes_of_a_small_message():
    # Pinned: changing the encoding of an existing message breaks deployed agents and controllers.
    # {"k": "stop_request", "v": [1, 11], "b": {"job": "abc"}}: only the minor version moved
    # (1.2 to 1.11 added fields with defaults and new messages; a 1.1 peer still decodes this).
    assert encode(StopRequest(job="abc")).hex() == (
        "83" "a16b" "ac73746f705f72657175657374" "a176" "92010b" "a162" "81" "a36a6f62" "a3616263"
    )


def test_golden_envelope_fields():
    raw = msgpack.unpackb(encode(ListRequest(all_users=False)))
    assert raw == {"k": "list_request", "v": list(PROTOCOL_VERSION),
                   "b": {"all_users": False, "include_finished": True, "after_ts": 0.0, "after_id": "", "history": -1}}


def test_round_trip_of_nested_messages():
    record = JobRecord(id="j1", spec=SPEC, state=ChainState.SUSPENDED, submit_ts=1.5, nodes=("n0", "n1"),
                       exits={"n0": 0, "n1": -15}, history=())
    ra = RunAssignment(job_id="j1", run_id=2, name="mnist", user="alice", group="default", priority=30, rank=1,
                       world_size=2, master_addr="10.0.0.1", master_port=20001, entrypoint=("python", "t.py"),
                       workdir="/w", desired=DesiredRun.SUSPEND, env={"A": "1"})
    for msg in (record, NodeAssignment(node="n1", fence=42, runs=(ra,)),
                RunEvent(event=RunEventKind.EXITED, node="n0", job_id="j1", run_id=2, ts=3.0, exit_code=None)):
        assert decode(encode(msg)) == msg
    assert decode(encode(record), JobRecord).exits == {"n0": 0, "n1": -15}


def test_every_registered_kind_is_unique_and_encodable_names():
    assert len(MESSAGE_TYPES) == len(set(MESSAGE_TYPES))
    assert all(cls.KIND == kind for kind, cls in MESSAGE_TYPES.items())


@pytest.mark.parametrize("data, text", [
    (b"", "msgpack"),
    (b"\xc1", "msgpack"),
    (msgpack.packb([1, 2, 3]), "envelope"),
    (msgpack.packb({"k": "nope", "v": [1, 0], "b": {}}), "unknown message kind"),
    (msgpack.packb({"k": "stop_request", "v": [1, 0], "b": {}}), "missing field 'job'"),
    (msgpack.packb({"k": "stop_request", "v": [1, 0], "b": {"job": 5}}), "expected str"),
    (msgpack.packb({"k": "stop_request", "v": [2, 0], "b": {"job": "a"}}), "upgrade hfai"),
    (msgpack.packb({"k": "stop_request", "v": "1.0", "b": {"job": "a"}}), "version"),
    (msgpack.packb({"k": "run_event", "v": [1, 0], "b": {"event": "exploded", "node": "n", "job_id": "j",
                                                         "run_id": 1, "ts": 1.0}}), "not a valid RunEventKind"),
    (msgpack.packb({"k": "list_request", "v": [1, 0], "b": {"all_users": 1}}), "expected bool"),
])
def test_bad_input_raises_one_typed_error(data, text):
    with pytest.raises(ProtocolError, match=text):
        decode(data)


def test_newer_minor_version_with_unknown_field_is_accepted():
    data = msgpack.packb({"k": "stop_request", "v": [1, 10], "b": {"job": "a", "reason": "new field"}})
    assert decode(data) == StopRequest(job="a")


def test_expected_type_is_enforced():
    with pytest.raises(ProtocolError, match="expected StopRequest"):
        decode(encode(ListRequest()), StopRequest)


def test_chain_state_edges():
    assert ChainState.QUEUED.check(ChainState.RUNNING) is ChainState.RUNNING
    from hfai.protocol.errors import IllegalTransition

    with pytest.raises(IllegalTransition):
        ChainState.SUCCEEDED.check(ChainState.RUNNING)
    with pytest.raises(IllegalTransition):
        ChainState.QUEUED.check(ChainState.SUSPENDING)


def test_priority_parsing():
    assert Priority.parse("high") == 30 and Priority.parse("EXTREME_HIGH") == 50 and Priority.parse("5") == 5
    with pytest.raises(InvalidRequest, match="unknown priority"):
        Priority.parse("urgent")


def test_subjects_carry_the_user_and_reject_bad_tokens():
    assert names.api_subject("alice", "submit") == "hfai.api.alice.submit"
    assert names.parse_api_subject("hfai.api.alice.submit") == ("alice", "submit", False)
    assert names.api_subject("root", "drain", operator=True) == "hfai.api.root.op.drain"
    assert names.parse_api_subject("hfai.api.root.op.drain") == ("root", "drain", True)
    for bad in ("a.b", "*", "", "a b", ">"):
        with pytest.raises(InvalidRequest):
            names.api_subject(bad, "submit")
    for bad in ("hfai.api.alice.x.drain", "hfai.api.alice", "hfai.agent.n.logs", "hfai.api.a.op.b.c"):
        with pytest.raises(InvalidRequest):
            names.parse_api_subject(bad)


def test_a_1_0_peer_still_decodes_and_is_decoded():
    # 1.1 only added fields with defaults: a 1.0 list request decodes with them defaulted, and the
    # 1.0 decoder of a peer ignores them (unknown fields of a newer minor are skipped).
    old = msgpack.packb({"k": "list_request", "v": [1, 0], "b": {"all_users": True, "include_finished": False}})
    assert decode(old, ListRequest) == ListRequest(include_finished=False)


def test_an_error_reply_carries_its_sub_code_and_one_without_it_still_decodes():
    from hfai.protocol.errors import ErrorSub, Unavailable, error_of
    from hfai.protocol.types import ErrorReply

    sent = ErrorReply(code="unavailable", message="nobody home", sub=ErrorSub.NO_RESPONDERS.value)
    assert decode(encode(sent), ErrorReply) == sent
    # A 1.9 peer's reply has no "sub": it reads as no case at all, and so does a case this side
    # does not know yet (a newer peer's).
    old = msgpack.packb({"k": "error_reply", "v": [1, 9], "b": {"code": "unavailable", "message": "m"}})
    assert decode(old, ErrorReply).sub == ""
    newer = msgpack.packb({"k": "error_reply", "v": [1, 11], "b": {"code": "forbidden", "message": "m",
                                                                   "sub": "some_future_case"}})
    e = error_of(**{k: getattr(decode(newer, ErrorReply), k) for k in ("code", "message", "sub")})
    assert e.sub is ErrorSub.NONE and type(e).__name__ == "Forbidden"
    raised = error_of(sent.code, sent.message, sent.sub)
    assert isinstance(raised, Unavailable) and raised.sub is ErrorSub.NO_RESPONDERS and str(raised) == "nobody home"
