"""The API's verb table (hfai.protocol.verbs) and the storage service's (hfai.protocol.storage):
each service serves exactly its table's verbs, decodes each request as the table's type, every
request and reply type round-trips, and each client calls by its table (its own ``call``/``scall``
takes a verb of the table and refuses a request of another type, sends copies of a repeatable one
only) through the API client's public requests, not as a subclass of it."""

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
from hfai.protocol import storage as s
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


@pytest.mark.parametrize("kind", sorted({k for v in (*verbs.VERBS.values(), *s.STORAGE_VERBS.values())
                                         for k in (v.request, v.reply)},
                                        key=lambda k: k.__name__), ids=lambda k: k.__name__)
def test_every_request_and_reply_type_round_trips(kind):
    msg = _sample(kind)
    assert decode(encode(msg), kind) == msg


def test_call_takes_the_request_its_verb_names():
    client = ApiClient(Config(nats=NatsConfig(url="nats://127.0.0.1:1")), user="alice")  # never connected
    with pytest.raises(TypeError, match="status takes a JobRequest, not a StopRequest"):
        asyncio.run(client.call(verbs.STATUS, t.StopRequest(job="j1")))  # type: ignore[arg-type]


def _storage_service():
    from hfai.core.config import StorageConfig
    from hfai.storage.service import StorageService

    return StorageService(Config(storage=StorageConfig(workspace_root="/nonexistent/ws", state_dir="/nonexistent/st")))


def test_the_storage_service_serves_every_verb_of_its_table_and_no_other():
    assert _storage_service().served == set(s.STORAGE_VERBS)
    assert all(verb.name == name for name, verb in s.STORAGE_VERBS.items())
    # Every verb constant of the module is in the table: none is served or called outside it.
    declared = {value for key, value in vars(s).items() if key.startswith("VERB_")}
    assert declared == set(s.STORAGE_VERBS)


@pytest.mark.parametrize("verb", sorted(s.STORAGE_VERBS.values(), key=lambda v: v.name), ids=lambda v: v.name)
def test_the_storage_service_decodes_a_request_as_its_verbs_type(verb):
    wrong = t.StopRequest(job="j1")  # no storage verb's request
    with pytest.raises(ProtocolError, match=f"expected {verb.request.__name__}, got"):
        asyncio.run(_storage_service()._dispatch(names.storage_subject("alice", verb.name), encode(wrong)))


def _storage_client(sent: list):
    from hfai.storage.client import StorageClient

    client = StorageClient(Config(nats=NatsConfig(url="nats://127.0.0.1:1")), user="alice")  # never connected

    async def request(subject, request, reply, *, timeout=None, repeatable=False, movable=False):
        sent.append((subject, type(request), reply, repeatable))
        return _sample(reply)

    client.api.request = request  # type: ignore[method-assign]
    return client


def test_scall_takes_the_request_its_verb_names_and_types_the_reply_by_it():
    sent: list = []
    client = _storage_client(sent)
    with pytest.raises(TypeError, match="ws_list takes a ListWorkspaces, not a WorkspaceRequest"):
        asyncio.run(client.scall(s.WS_LIST, s.WorkspaceRequest(workspace="w")))  # type: ignore[arg-type]
    assert sent == []
    reply = asyncio.run(client.scall(s.WS_REMOVE, s.WorkspaceRequest(workspace="w")))
    assert isinstance(reply, s.WorkspaceInfo)
    assert sent == [("hfai.storage.alice.ws_remove", s.WorkspaceRequest, s.WorkspaceInfo, False)]


def test_scall_sends_copies_of_a_repeatable_storage_verb_only():
    sent: list = []
    client = _storage_client(sent)
    asyncio.run(client.scall(s.WS_LIST, s.ListWorkspaces()))
    asyncio.run(client.scall(s.WS_PUT, s.PutRequest(workspace="w", chunks=())))
    assert [(subject.rsplit(".", 1)[1], repeatable) for subject, _, _, repeatable in sent] == \
        [("ws_list", True), ("ws_put", False)]


def test_no_extension_subclasses_the_api_client():
    """The storage client and hfai exec's use ApiClient's public calls by holding one."""
    import hfai.cli.exec  # noqa: F401
    import hfai.storage.client  # noqa: F401

    assert ApiClient.__subclasses__() == []


def test_a_request_encoded_already_is_taken_by_its_kind():
    """A push sends its commit packed already (codec.encode_packed): the table still checks it."""
    from hfai.protocol import codec

    manifest = s.Manifest()
    packed = codec.encode_packed(s.CommitRequest(workspace="w", manifest=manifest), manifest=codec.pack(manifest))
    s.WS_COMMIT.check(packed)
    with pytest.raises(TypeError, match="ws_put takes a PutRequest, not an encoded ws_commit_request"):
        s.WS_PUT.check(packed)
    sent: list = []
    asyncio.run(_storage_client(sent).scall(s.WS_COMMIT, packed))
    assert sent == [("hfai.storage.alice.ws_commit", codec.Encoded, s.WorkspaceInfo, False)]
