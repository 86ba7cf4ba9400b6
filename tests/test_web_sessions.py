"""hfai-web's sessions end and leave nothing behind (issue 26 §4): many sign-ins, sign-outs,
idle sessions and refused (revoked) credentials return the NATS server's connections, this
process's file descriptors and the credential files to their baseline.

hfai-web runs in this process (aiohttp, on a free port) against a real nats-server with the local
cluster's credentials; requests are real HTTP. The issue signed in 1,000 times; 150 sign-ins here
(a few seconds on 2 busy cores) show the same: the sessions per user stay bounded while they come,
and all of them are gone once idle."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import aiohttp
import psutil
import pytest
from waits import until, wait_for

from hfai.auth.roles import Role
from hfai.cli.local import LocalCluster
from hfai.core.accounts import push_account
from hfai.core.clock import FakeClock
from hfai.core.config import WebConfig
from hfai.web.service import WebService
from hfai.web.sessions import COOKIE

SIGN_INS = 150
PER_USER = 4
IDLE_S = 1.5
SWEEP_S = 0.2


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """NATS with the local cluster's credentials (and the storage service); no controller is
    needed: signing in is connecting to NATS."""
    lc = LocalCluster(root=tmp_path_factory.mktemp("web-sessions"), nodes=0, controllers=0)
    lc.up()
    try:
        # The storage service's connection: part of the baseline.
        wait_for(lambda: server_connections(lc) >= 1, 30, "hfai-storage to connect to NATS", poll=0.05)
        yield lc
    finally:
        lc.down()


class Web:
    """hfai-web in this process, and what its sessions hold."""

    def __init__(self, local: LocalCluster, **web):
        config = local.config()
        self.local = local
        self.clock = FakeClock()  # the sessions' idleness: moved by the test, not waited for
        web = {"session_idle_s": IDLE_S, "session_sweep_s": SWEEP_S, "sessions_per_user": PER_USER, **web}
        self.config = dataclasses.replace(
            config, web=WebConfig(port=0, **web),
            nats=dataclasses.replace(config.nats, creds=str(local.service_creds("hfai-web", Role.WEB))))
        self.service = WebService(self.config, clock=self.clock)
        self.http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Web:
        await self.service.start()
        self.http = aiohttp.ClientSession(f"http://127.0.0.1:{self.service.port}")
        async with self.http.get("/healthz") as r:  # the keep-alive connection is part of the baseline
            assert r.status == 200
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.http is not None
        await self.http.close()
        await self.service.close()

    async def sign_in(self, user: str) -> tuple[int, str]:
        """(HTTP status, session cookie or "") of one sign-in with ``user``'s credentials file."""
        assert self.http is not None
        creds = self.local.user_creds(user).read_text()
        async with self.http.post("/login", data={"creds": creds}, allow_redirects=False) as r:
            morsel = r.cookies.get(COOKIE)
            return r.status, morsel.value if morsel is not None else ""

    async def get(self, path: str, sid: str) -> int:
        assert self.http is not None
        async with self.http.get(path, cookies={COOKIE: sid}, allow_redirects=False) as r:
            return r.status

    def count(self) -> int:
        return len(self.service.sessions._by_id)

    def creds_files(self) -> int:
        return len(list(Path(self.service.sessions._dir).iterdir()))


def server_connections(local: LocalCluster) -> int:
    """Client connections the nats-server holds (established TCP, seen from its side)."""
    port = int(local.url.rsplit(":", 1)[1])
    server = psutil.Process(local.pids.get("nats") or local._procs["nats"].pid)
    return sum(1 for c in server.net_connections("tcp") if c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def descriptors() -> int:
    return psutil.Process().num_fds()


async def test_many_sign_ins_stay_bounded_and_idle_sessions_leave_nothing(local):
    async with Web(local) as w:
        base_conns, base_fds = server_connections(local), descriptors()
        statuses = [(await w.sign_in("alice"))[0] for _ in range(SIGN_INS)]
        assert statuses == [302] * SIGN_INS
        # Bounded while they come: the oldest went at each sign-in beyond PER_USER.
        assert w.count() == PER_USER == w.creds_files()
        await until(lambda: server_connections(local) <= base_conns + PER_USER, 5, "the server to drop evicted ones")
        # Idle past session_idle_s: the sweep ends them all, with nobody asking.
        assert w.count() == PER_USER
        await w.clock.advance(IDLE_S + SWEEP_S)
        await until(lambda: w.count() == 0 == w.creds_files(), 5, "the idle sessions to end")
        await until(lambda: server_connections(local) == base_conns, 5, "the server to drop the connections")
        assert descriptors() <= base_fds


async def test_sign_out_has_closed_the_session_when_it_answers(local):
    async with Web(local) as w:
        base_conns = server_connections(local)
        _, sid = await w.sign_in("bob")
        assert await w.get("/api/jobs", sid) != 401  # signed in (no controller here: 503)
        assert server_connections(local) == base_conns + 1
        assert w.http is not None
        async with w.http.post("/logout", cookies={COOKIE: sid}, allow_redirects=False) as r:
            assert r.status == 302
        assert w.count() == 0 and w.creds_files() == 0
        await until(lambda: server_connections(local) == base_conns, 5, "the server to see the connection closed")
        assert await w.get("/api/jobs", sid) == 401


async def test_an_idle_session_is_refused_and_closed_at_its_next_request(local):
    async with Web(local, session_sweep_s=3600.0) as w:
        _, sid = await w.sign_in("carol")
        await w.clock.advance(IDLE_S + 0.2)
        assert w.count() == 1  # no sweep ran
        assert await w.get("/api/jobs", sid) == 401
        assert w.count() == 0 and w.creds_files() == 0


async def test_refused_credentials_leave_no_socket_behind(local):
    creds = local.user_creds("mallory").read_text()
    issuer = local.issuer()
    issuer.revoke("mallory")
    await push_account(issuer, local.config())
    async with Web(local) as w:
        assert w.http is not None
        base_fds = descriptors()
        gc.disable()  # a leaked socket must not be hidden by a collection that happens to run
        try:
            for _ in range(30):
                async with w.http.post("/login", data={"creds": creds}, allow_redirects=False) as r:
                    assert r.status == 403, await r.text()
            assert descriptors() <= base_fds
        finally:
            gc.enable()
        assert w.count() == 0 and w.creds_files() == 0


async def test_credential_files_are_not_named_after_the_cookie(local):
    """Issue 39 item 14: the files were ``<cookie>.creds``: whoever could list the folder could sign
    in as everyone."""
    async with Web(local) as w:
        cookies = [(await w.sign_in(user))[1] for user in ("alice", "bob")]
        names = [p.name for p in Path(w.service.sessions._dir).iterdir()]
        assert len(names) == 2 and all(c for c in cookies)
        assert not any(c in name for c in cookies for name in names), (cookies, names)
        for sid in cookies:  # the sessions work, and signing out removes their files all the same
            assert await w.get("/api/jobs", sid) != 401
            assert w.http is not None
            async with w.http.post("/logout", cookies={COOKIE: sid}, allow_redirects=False) as r:
                assert r.status == 302
        assert w.creds_files() == 0


async def test_refused_credentials_are_not_told_where_the_server_wrote_them(local):
    """Issue 39 item 14: the sign-in page said "refused the credentials in /tmp/hfai-web-…"."""
    creds = local.user_creds("trudy").read_text()
    issuer = local.issuer()
    issuer.revoke("trudy")
    await push_account(issuer, local.config())
    async with Web(local) as w:
        assert w.http is not None
        async with w.http.post("/login", data={"creds": creds}, allow_redirects=False) as r:
            page = await r.text()
        assert r.status == 403 and "refused these credentials" in page, page
        assert str(w.service.sessions._dir) not in page and "hfai-web-" not in page, page
