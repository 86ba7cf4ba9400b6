"""The API's verb table (hfai.protocol.verbs): the controller serves exactly its verbs, decodes
each request as the table's type, every request and reply type round-trips, and the client's
``call`` takes a verb of the table and refuses a request of another type."""

from __future__ import annotations

import asyncio
import enum
import types
import typing

import pytest

from hfai.api.client import ApiClient
from hfai.controller.api import ApiService
from hfai.core.config import Config, NatsConfig
from hfai.protocol import ProtocolError, _lazy, decode, encode, names, verbs
from hfai.protocol import types as t


def test_the_controller_serves_every_verb_of_the_table_and_no_other():
    service = ApiService(None, None, None)  # type: ignore[arg-type]  (dispatch needs none of them)
    assert service.served == set(verbs.VERBS)
    assert set(names.VERBS) == set(verbs.VERBS)  # the names of subjects, the same list
    assert all(verb.name == name for name, verb in verbs.VERBS.items())


def test_the_controller_decodes_a_request_as_its_verbs_type():
    service = ApiService(None, None, None)  # type: ignore[arg-type]
    subject = names.api_subject("alice", names.VERB_STATUS)
    with pytest.raises(ProtocolError, match="expected JobRequest"):
        asyncio.run(service._dispatch(subject, encode(t.StopRequest(job="j1"))))


def _sample(tp, depth: int = 0):
    """A value of type ``tp`` other than a field's default, so that a round trip shows it."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return _sample(next(a for a in args if a is not type(None)), depth)
    if origin is tuple:
        return () if depth > 3 else (_sample(args[0], depth + 1),)
    if origin is dict:
        return {} if depth > 3 else {_sample(args[0], depth + 1): _sample(args[1], depth + 1)}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return list(tp)[-1]
    if _lazy.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _sample(hints[f.name], depth + 1) for f in _lazy.fields(tp) if f.init})
    return {str: "x1", int: 7, float: 2.5, bool: True, bytes: b"\x00b"}[tp]


@pytest.mark.parametrize("kind", sorted({k for v in verbs.VERBS.values() for k in (v.request, v.reply)},
                                        key=lambda k: k.__name__), ids=lambda k: k.__name__)
def test_every_request_and_reply_type_round_trips(kind):
    msg = _sample(kind)
    assert decode(encode(msg), kind) == msg


def test_call_takes_the_request_its_verb_names():
    client = ApiClient(Config(nats=NatsConfig(url="nats://127.0.0.1:1")), user="alice")  # never connected
    with pytest.raises(TypeError, match="status takes a JobRequest, not a StopRequest"):
        asyncio.run(client.call(verbs.STATUS, t.StopRequest(job="j1")))  # type: ignore[arg-type]
