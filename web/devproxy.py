"""``/dev/<session>/...``: hfai-web's proxy to a development session's JupyterLab, HTTP and
WebSockets (kernels, terminals), for the session's owner alone, on the page's own sign-in.

Each request is checked as its signed-in user: the user's own API connection reads the job (so
the controller and the NATS server decide what the user sees, as everywhere in hfai-web), and it
must be a session of kind ``dev`` whose owner is the user; anyone else gets 403, on the page and on
its WebSockets. Where the session listens comes from the agent of its node (``hfai.agent.<node>.dev``,
asked with hfai-web's own credential, which only hfai-web and the controllers hold): the node's
address (loopback on a local cluster), the port, and the token JupyterLab was started with. The
proxy adds the token to every request it relays and takes it out of the pages it returns, and
takes hfai-web's own session cookie out of what it relays: the browser never holds the token and
JupyterLab never sees the sign-in. A session that is not running gets a page saying so (stopped,
or starting), never a bare 502. docs/web.md has the picture.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from hfai.protocol import decode, encode, names
from hfai.protocol.errors import Forbidden, HfaiError, NotFound, error_of
from hfai.protocol.reasons import ReasonCode, describe
from hfai.protocol.types import JOB_DEV, ChainState, DevSessionReply, DevSessionRequest, ErrorReply, JobRecord
from hfai.web.pages import error_page

log = logging.getLogger(__name__)

#: Headers of one hop only (RFC 9110 7.6.1), never relayed; and the ones the proxy sets itself.
HOP_HEADERS = frozenset(h.lower() for h in (
    "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "TE", "Trailer",
    "Transfer-Encoding", "Upgrade", "Host", "Authorization", "Origin", "Accept-Encoding", "Content-Length",
    "Sec-WebSocket-Key", "Sec-WebSocket-Version", "Sec-WebSocket-Extensions", "Sec-WebSocket-Accept",
    "Sec-WebSocket-Protocol"))
#: How long a checked session's owner and address are reused (a page load is dozens of requests).
CACHE_S = 2.0
#: The largest page whose body the proxy reads to take the token out of it.
MAX_SCRUBBED_BYTES = 32 * 1024 * 1024


def request_headers(headers, cookie_name: str, token: str) -> dict[str, str]:
    """What is relayed to JupyterLab: the browser's headers without the hop-by-hop ones and without
    hfai-web's cookie, with the session's token."""
    out: dict[str, str] = {}
    for k, v in headers.items():
        low = k.lower()
        if low in HOP_HEADERS:
            continue
        if low == "cookie":
            v = strip_cookie(v, cookie_name)
            if not v:
                continue
        out[k] = v
    out["Authorization"] = f"token {token}"
    return out


def strip_cookie(header: str, name: str) -> str:
    """A Cookie header without the cookie ``name``."""
    parts = [p.strip() for p in header.split(";")]
    return "; ".join(p for p in parts if p and p.split("=", 1)[0].strip() != name)


def response_headers(headers) -> list[tuple[str, str]]:
    """What is relayed back to the browser: all but the hop-by-hop headers."""
    return [(k, v) for k, v in headers.items() if k.lower() not in HOP_HEADERS]


def ended_words(job: JobRecord) -> str:
    """What an ended session's page says: its state and reason ("is stopped: idle for 4 h"), and
    how to go on unless the reason says it already (a session whose node was lost)."""
    why = describe(job)
    words = why if why.startswith(job.state.value) else f"{job.state.value}: {why}"
    hint = "" if job.why is not None and job.why.code == ReasonCode.DEV_NODE_LOST else (
        " Start a new one with: hfai dev start. Your notebooks are kept.")
    return f"Development session {job.spec.name} ({job.id}) is {words}.{hint}"


def status_page(title: str, text: str, refresh_s: int = 0, user: str = "") -> str:
    """The page a browser gets for a session that is not there to proxy to: the site's own, with
    its navigation for ``user``."""
    return error_page(title, text, user, refresh_s, text_id="dev-status")


@dataclass
class Target:
    job: JobRecord
    where: DevSessionReply
    until: float


class DevProxy:
    """The proxy's routes. ``nc`` gives hfai-web's own NATS connection; ``session_of`` the
    signed-in session of a request (hfai.web.service adds it in its middleware)."""

    def __init__(self, nc: Callable[[], object], session_of: Callable[[web.Request], object], cookie_name: str,
                 request_timeout_s: float = 5.0):
        self._nc = nc
        self._session_of = session_of
        self._cookie = cookie_name
        self._timeout = request_timeout_s
        self._client: aiohttp.ClientSession | None = None
        self._cache: dict[tuple[str, str], Target] = {}

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_route("*", "/dev/{id}", self.redirect)
        router.add_route("*", "/dev/{id}/{tail:.*}", self.handle)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._client is None:
            self._client = aiohttp.ClientSession(
                auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None, connect=self._timeout, sock_connect=self._timeout))
        return self._client

    async def redirect(self, request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound(f"/dev/{request.match_info['id']}/")

    # ------------------------------------------------------------------------ which session

    async def _target(self, request: web.Request, fresh: bool = False) -> Target | web.Response:
        """The session to relay to, or the page to answer with instead."""
        session = self._session_of(request)
        user, job_id = session.user, request.match_info["id"]  # type: ignore[attr-defined]
        key = (session.id, job_id)  # type: ignore[attr-defined]
        found = self._cache.get(key)
        now = time.monotonic()
        if found is not None and found.until > now and not fresh:
            return found
        self._cache.pop(key, None)
        try:
            job = await session.api.status(job_id)  # type: ignore[attr-defined]
        except NotFound:
            return _page(404, "No such session", f"There is no development session {job_id}.", user=user)
        if job.spec.kind != JOB_DEV or job.id != job_id:
            return _page(404, "Not a session", f"{job_id} is a job, not a development session.", user=user)
        if job.spec.user != user:
            return _page(403, "Forbidden", f"Development session {job_id} belongs to {job.spec.user}; "
                                           "only its owner may open it.", user=user)
        if job.state.final:
            return _page(410, "Session stopped", ended_words(job), user=user)
        if job.state is not ChainState.RUNNING or not job.nodes:
            return _page(503, "Session not running",
                         f"Development session {job.spec.name} ({job.id}) is {job.state.value}; "
                         "this page reloads until it runs.", refresh_s=2, user=user)
        where = await self._ask_agent(job.nodes[0], job.id, user)
        if not where.ready:
            return _page(503, "Session starting", f"JupyterLab of {job.spec.name} ({job.id}) is starting on "
                                                  f"{job.nodes[0]}; this page reloads until it answers.", 2, user)
        target = self._cache[key] = Target(job, where, now + CACHE_S)
        if len(self._cache) > 10_000:  # sessions come and go: keep the cache the size of the live ones
            self._cache = {k: t for k, t in self._cache.items() if t.until > now}
        return target

    async def _ask_agent(self, node: str, job_id: str, user: str) -> DevSessionReply:
        nc = self._nc()
        try:
            msg = await nc.request(names.agent_dev_subject(node),  # type: ignore[attr-defined]
                                   encode(DevSessionRequest(job_id=job_id, user=user)), timeout=self._timeout)
        except Exception as e:  # no responders, a timeout: the node's agent is not there now
            log.info("the agent of %s did not say where session %s listens: %s", node, job_id, e)
            return DevSessionReply()
        reply = decode(msg.data, (DevSessionReply, ErrorReply))
        if isinstance(reply, ErrorReply):
            raise error_of(reply.code, reply.message, reply.sub)
        return reply

    # ------------------------------------------------------------------------ relaying

    async def handle(self, request: web.Request) -> web.StreamResponse:
        user = self._session_of(request).user  # type: ignore[attr-defined]
        try:
            target = await self._target(request)
        except Forbidden as e:
            return _page(403, "Forbidden", str(e), user=user)
        except HfaiError as e:
            return _page(503, "Session unavailable", str(e), refresh_s=5, user=user)
        if isinstance(target, web.Response):
            return target
        where = target.where
        url = f"http://{_host(where.address)}:{where.port}{request.rel_url}"
        headers = request_headers(request.headers, self._cookie, where.token)
        try:
            if request.headers.get("Upgrade", "").lower() == "websocket":
                return await self._relay_ws(request, url, headers)
            return await self._relay_http(request, url, headers, where.token)
        except (TimeoutError, aiohttp.ClientConnectionError):
            again = await self._target(request, fresh=True)  # stopped meanwhile, or not listening yet
            if isinstance(again, web.Response):
                return again
            self._cache.clear()
            return _page(503, "Session starting", f"JupyterLab of {target.job.spec.name} ({target.job.id}) does not "
                                                  "answer yet; this page reloads until it does.", 2, user)

    async def _relay_http(self, request: web.Request, url: str, headers: dict[str, str],
                          token: str) -> web.StreamResponse:
        body = request.content if request.body_exists else None
        async with self._http().request(request.method, url, headers=headers, data=body,
                                        allow_redirects=False) as up:
            out_headers = response_headers(up.headers)
            if up.content_type == "text/html" and "Content-Encoding" not in up.headers and \
                    (up.content_length or 0) <= MAX_SCRUBBED_BYTES:
                # JupyterLab writes its token into the page's config: the browser must not get it.
                data = (await up.read()).replace(token.encode(), b"")
                page = web.Response(status=up.status, reason=up.reason, body=data)
                _set_headers(page, out_headers)
                return page
            resp = web.StreamResponse(status=up.status, reason=up.reason)
            _set_headers(resp, out_headers)
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp

    async def _relay_ws(self, request: web.Request, url: str, headers: dict[str, str]) -> web.StreamResponse:
        wanted = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
        async with self._http().ws_connect(url, headers=headers, protocols=wanted, max_msg_size=0,
                                           autoping=True) as up:
            down = web.WebSocketResponse(protocols=(up.protocol,) if up.protocol else (), max_msg_size=0,
                                         autoping=True)
            await down.prepare(request)
            await _pipe_both(down, up)
            return down


def _page(status: int, title: str, text: str, refresh_s: int = 0, user: str = "") -> web.Response:
    return web.Response(status=status, text=status_page(title, text, refresh_s, user), content_type="text/html")


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _set_headers(resp: web.StreamResponse, headers: list[tuple[str, str]]) -> None:
    for k, v in headers:
        if k.lower() == "content-type":
            resp.headers[k] = v
        else:
            resp.headers.add(k, v)  # Set-Cookie may come more than once


async def _pipe_both(down: web.WebSocketResponse, up: aiohttp.ClientWebSocketResponse) -> None:
    """Relay messages both ways until either side closes, then close the other."""

    async def pump(src, dst) -> None:
        async for msg in src:
            if msg.type is aiohttp.WSMsgType.TEXT:
                await dst.send_str(msg.data)
            elif msg.type is aiohttp.WSMsgType.BINARY:
                await dst.send_bytes(msg.data)
            elif msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.ERROR):
                break

    tasks = [asyncio.ensure_future(pump(down, up)), asyncio.ensure_future(pump(up, down))]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await up.close()
        await down.close()
