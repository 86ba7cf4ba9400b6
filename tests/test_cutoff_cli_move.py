"""When a CLI call left unanswered moves to another NATS server (hfai.api.client: ApiClient._move),
without NATS: a client that may ask JetStream moves only if the cluster check of hfai.core.cutoff
says its server is cut off; one whose credentials may not (a user's) moves on the silence alone;
it goes to a configured server it has not left, and nowhere once none is left."""

from __future__ import annotations

from types import SimpleNamespace
from urllib.parse import urlparse

from hfai.api.client import ApiClient
from hfai.core import cutoff as _cutoff
from hfai.core import nats as _nats
from hfai.core.config import Config, NatsConfig

URLS = "nats://10.0.0.1:4222,nats://10.0.0.2:4222,nats://10.0.0.3:4222"


def _client(monkeypatch, tmp_path, verdict: str, creds: bool = False) -> tuple[ApiClient, list[str], list[str]]:
    """A client connected (so it thinks) to the first server; returns it, the URLs it then
    connects to, and the cluster checks it asked."""
    monkeypatch.setenv("HFAI_HOME", str(tmp_path))
    api = ApiClient(Config(nats=NatsConfig(url=URLS)), user="alice")
    if creds:  # a user's: JetStream is not among what they may publish
        monkeypatch.setattr(api, "_credentials", object())
        monkeypatch.setattr(_nats, "_check_stream", lambda creds: None)
    api._nc = SimpleNamespace(connected_url=urlparse("nats://10.0.0.1:4222"), jetstream=lambda timeout: None)
    dialled: list[str] = []
    asked: list[str] = []

    async def connect(config, name, reconnect, creds, on_error):
        dialled.append(config.nats.url)
        return SimpleNamespace(connected_url=urlparse(config.nats.url.split(",")[0]), jetstream=lambda timeout: None)

    async def check(js, timeout_s, stream=None, silent_s=3.0):
        asked.append(stream or "account")
        return verdict

    monkeypatch.setattr(_nats, "connect", connect)
    monkeypatch.setattr(_cutoff, "check", check)
    return api, dialled, asked


async def test_a_client_that_may_ask_stays_while_the_cluster_answers(monkeypatch, tmp_path):
    api, dialled, asked = _client(monkeypatch, tmp_path, verdict="")
    assert await api._move(check=True) is None
    assert asked and dialled == [] and api._conn.connected_url.netloc == "10.0.0.1:4222"


async def test_a_client_moves_when_the_check_says_cut_off_and_then_to_the_last_server(monkeypatch, tmp_path):
    api, dialled, asked = _client(monkeypatch, tmp_path, verdict="no JetStream answer within 1s")
    first = api._conn
    moved = await api._move(check=True)
    assert moved is api._conn and api._left == [first]
    assert dialled == ["nats://10.0.0.2:4222,nats://10.0.0.3:4222"]
    await api._move(check=True)
    assert dialled[-1] == "nats://10.0.0.3:4222"
    assert not api._movable() and await api._move(check=True) is None  # none left


async def test_a_users_client_moves_on_silence_and_no_responders_skips_the_check(monkeypatch, tmp_path):
    api, dialled, asked = _client(monkeypatch, tmp_path, verdict="", creds=True)
    assert await api._move(check=True) is not None and asked == []
    api2, dialled2, asked2 = _client(monkeypatch, tmp_path, verdict="")
    assert await api2._move(check=False) is not None and asked2 == []
