"""Code decides on an error's sub-code (hfai.protocol.errors.ErrorSub), never on its words: each
place that used to match a message is given the same case in other words here, and still decides
the same way. The one reading of nats-py's words (hfai.core.nats.server_refusal) is held against a
real server's in tests/test_auth.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import nats.errors
import pytest

from hfai.api.client import ApiClient
from hfai.core import nats as _nats
from hfai.core.config import Config, NatsConfig
from hfai.protocol import decode, encode
from hfai.protocol import storage as s
from hfai.protocol.errors import ErrorSub, Forbidden, Unavailable, error_of
from hfai.protocol.types import ErrorReply
from hfai.storage import push as storage_push
from hfai.storage.client import StorageClient
from hfai.storage.push import CommitSeen

REWORDED = "the service is not there at all"  # matches none of the old tests of the words


def _storage_client(monkeypatch, raises: BaseException | None = None, reply=None) -> StorageClient:
    client = StorageClient(Config(nats=NatsConfig(url="nats://127.0.0.1:1")), user="alice")  # never connected

    async def request(subject, request, expect, *, timeout=None, **_):
        if raises is not None:
            raise raises
        return reply

    monkeypatch.setattr(client.api, "request", request)
    return client


def test_storage_says_no_service_runs_by_the_sub_code(monkeypatch):
    client = _storage_client(monkeypatch, Unavailable(REWORDED, sub=ErrorSub.NO_RESPONDERS))
    with pytest.raises(Unavailable, match="no storage service answers") as e:
        asyncio.run(client.scall(s.WS_LIST, s.ListWorkspaces()))
    assert e.value.sub is ErrorSub.NO_RESPONDERS  # told on, for _commit_alive
    # "no controller" in the words, another case: passed on as it is.
    other = _storage_client(monkeypatch, Unavailable("no controller, no answer", sub=ErrorSub.NO_ANSWER))
    with pytest.raises(Unavailable, match="no controller, no answer"):
        asyncio.run(other.scall(s.WS_LIST, s.ListWorkspaces()))


@pytest.mark.parametrize("raises, reply, seen", [
    (Unavailable(REWORDED, sub=ErrorSub.NO_RESPONDERS), None, CommitSeen.NOT_RUNNING),
    (Unavailable("no storage service answers (in other words)", sub=ErrorSub.NO_ANSWER), None, CommitSeen.SILENT),
    (None, s.CommitStatus(workspace="ws", committing=False), CommitSeen.FORGOTTEN),
    (None, s.CommitStatus(workspace="ws", committing=True), CommitSeen.GOING),
])
def test_a_commits_ping_reads_the_sub_code(monkeypatch, raises, reply, seen):
    assert asyncio.run(storage_push._commit_alive(_storage_client(monkeypatch, raises, reply), "ws")) is seen


class _Committing:
    """A storage client whose commit never answers and whose pings say ``seen`` in turn."""

    def __init__(self, seen: list[bool]):
        self.seen = seen

    def room(self) -> int:
        return 1 << 20

    async def scall(self, verb, request, timeout_s=None):
        if verb is s.WS_COMMIT:
            await asyncio.Event().wait()
        return s.CommitStatus(workspace="ws", committing=self.seen.pop(0))


def test_a_commit_ends_on_the_second_forgotten_ping_in_a_row_only():
    client = _Committing([False, True, False, False])
    with pytest.raises(Unavailable, match="restarted while committing workspace ws"):
        asyncio.run(storage_push.commit(client, "ws", s.Manifest(), timeout_s=60,  # type: ignore[arg-type]
                                          ping_s=0.001))
    assert client.seen == []  # not at the first "not committing": that one may be the reply on its way


def test_an_exec_start_tells_the_servers_refusal_from_the_agents(monkeypatch):
    from hfai.cli.exec import ExecClient

    def refusing(e: BaseException) -> ExecClient:
        api = ApiClient(Config(nats=NatsConfig(url="nats://127.0.0.1:1")), user="alice")  # never connected

        async def request(*a, **k):
            raise e

        monkeypatch.setattr(api, "request", request)
        return ExecClient(api)

    with pytest.raises(Forbidden, match="run commands in jobs"):
        asyncio.run(refusing(Forbidden(REWORDED, sub=ErrorSub.SUBJECT_DENIED)).start("n0", None))  # type: ignore
    agents = Forbidden("the cluster does not let you: job j1 belongs to bob")  # the agent's, whatever its words
    with pytest.raises(Forbidden, match="belongs to bob"):
        asyncio.run(refusing(agents).start("n0", None))  # type: ignore[arg-type]


@pytest.mark.parametrize("error, sub", [
    (nats.errors.Error("nats: 'Authorization Violation'"), ErrorSub.CREDENTIALS_REFUSED),
    (nats.errors.AuthorizationError(), ErrorSub.CREDENTIALS_REFUSED),  # its words: "authorization failed"
    (nats.errors.Error('nats: permissions violation for publish to "hfai.api.bob.stop"'), ErrorSub.SUBJECT_DENIED),
    (nats.errors.NoServersError(), ErrorSub.NONE),
    (OSError("connection refused"), ErrorSub.NONE),
])
def test_the_one_reading_of_nats_py_words(error, sub):
    assert _nats.server_refusal(error) is sub
    assert _nats.denies(error, "hfai.api.bob.stop") is (sub is ErrorSub.SUBJECT_DENIED)
    assert not _nats.denies(error, "hfai.api.bob")  # a prefix of the subject is another subject


def test_a_sub_code_crosses_the_wire_with_its_error():
    sent: list[bytes] = []

    async def respond(data: bytes) -> None:
        sent.append(data)

    async def dispatch(subject: str, data: bytes):
        raise Unavailable(REWORDED, sub=ErrorSub.NO_RESPONDERS)

    msg = SimpleNamespace(subject="hfai.storage.alice.ws_list", data=b"", reply="_INBOX.1", respond=respond)
    asyncio.run(_nats.answer(msg, dispatch, "test"))
    reply = decode(sent[0], ErrorReply)
    assert reply.sub == "no_responders"
    e = error_of(reply.code, reply.message, reply.sub)
    assert isinstance(e, Unavailable) and e.sub is ErrorSub.NO_RESPONDERS and str(e) == REWORDED
    assert encode(reply) == sent[0]
