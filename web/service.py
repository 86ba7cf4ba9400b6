"""The hfai-web daemon: an aiohttp application over the normal API.

Every page and JSON endpoint acts through the signed-in user's own NATS connection
(:mod:`hfai.web.sessions`), so what a user may see and do is decided by the NATS server and the
controller exactly as for the CLI. The service's own credential (role ``web``) only reads the
telemetry history for the charts."""

from __future__ import annotations

import logging
import time

from aiohttp import web
from nats.aio.client import Client

from hfai.api.client import LIST_HISTORY
from hfai.api.present import csv_lines, totals
from hfai.core import nats as _nats
from hfai.core.clock import SYSTEM, Clock
from hfai.core.config import Config
from hfai.core.daemon import Supervisor
from hfai.protocol.errors import Forbidden, HfaiError, InvalidRequest, NotFound, Unavailable
from hfai.protocol.types import ListRequest, UsageRow
from hfai.web import assets, pages, views
from hfai.web.devproxy import DevProxy
from hfai.web.series import cluster_series, gpu_lines, heat_map, job_gpu
from hfai.web.sessions import COOKIE, Session, Sessions
from hfai.web.telemetry import TelemetryHistory
from hfai.web.timeline import job_timeline, timeline

log = logging.getLogger(__name__)

SESSION_KEY = web.RequestKey("session", Session)
#: Largest log a download assembles (the rest is on the node; `hfai logs` reads all of it).
MAX_DOWNLOAD_BYTES = 64 * 1024 * 1024
_STATUS = {Forbidden: 403, NotFound: 404, InvalidRequest: 400, Unavailable: 503}
#: The heading of the page a browser gets for an error of that HTTP status.
_TITLES = {403: "Forbidden", 404: "Not found", 400: "Bad request", 503: "Unavailable"}
#: The windows the cluster page offers (seconds); the telemetry covers [web] telemetry_max_age_s.
WINDOWS = {3600: "last hour", 86400: "last day"}


def _status(e: HfaiError) -> int:
    return next((code for kind, code in _STATUS.items() if isinstance(e, kind)), 400)


class WebService:
    def __init__(self, config: Config, clock: Clock = SYSTEM):
        self.config = config
        self.sessions = Sessions(config, clock)
        self.telemetry = TelemetryHistory(config)
        self.assets = assets.Assets()
        self._supervisor = Supervisor()
        self._runner: web.AppRunner | None = None
        self._nc: Client | None = None
        self.devproxy = DevProxy(lambda: self._nc, _session, COOKIE)
        self.port = 0
        self._closed = False

    # ------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._nc = nc = await _nats.connect(self.config, name="hfai-web")
        self._supervisor.spawn(self.telemetry.follow(nc), "telemetry")
        self._supervisor.spawn(self.sessions.sweep_forever(), "session-sweep")
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.web.host, max(0, self.config.web.port))
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        log.info("hfai-web on http://%s:%d/", self.config.web.host, self.port)

    async def failed(self) -> str:
        return await self._supervisor.failed()

    async def close(self) -> None:
        """Stop serving, close every session; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._runner is not None:
            await self._runner.cleanup()
        await self._supervisor.stop()
        await self.sessions.close()
        await self.assets.close()
        await self.devproxy.close()
        if self._nc is not None:
            await self._nc.close()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth, self._errors], client_max_size=64 * 1024)
        r = app.router
        r.add_get("/login", self.login_form)
        r.add_post("/login", self.login)
        r.add_post("/logout", self.logout)
        r.add_get("/", self.home)
        r.add_get("/healthz", self.healthz)
        r.add_get(assets.script_url(), self.plotly_js)
        for path, page in (("/jobs", pages.jobs_page), ("/nodes", pages.nodes_page), ("/cluster", pages.cluster_page),
                           ("/usage", pages.usage_page)):
            r.add_get(path, self._page(page))
        r.add_get("/jobs/{id}", self.job_page)  # a job's, or a job array's (by the array's id or name)
        r.add_get("/jobs/{id}/logs/{rank}/download", self.log_download)
        r.add_get("/usage.csv", self.usage_csv)
        r.add_get("/api/jobs", self.api_jobs)
        r.add_get("/api/jobs/{id}", self.api_job)
        r.add_get("/api/arrays/{id}", self.api_array)
        r.add_post("/api/jobs/{id}/stop", self.api_stop)
        r.add_get("/api/jobs/{id}/logs/{rank}", self.api_log)
        r.add_get("/api/nodes", self.api_nodes)
        r.add_get("/api/cluster", self.api_cluster)
        r.add_get("/api/usage", self.api_usage)
        self.devproxy.add_routes(r)  # /dev/<session>/...: development sessions (web/devproxy.py)
        return app

    async def home(self, _request: web.Request) -> web.StreamResponse:
        raise web.HTTPFound("/jobs")

    async def plotly_js(self, request: web.Request) -> web.Response:
        """plotly.js from the installed wheel: gzipped where the browser takes it, cached for a year
        (its URL names the version), 304 for a browser that has it."""
        asset = await self.assets.plotly()
        headers = {"Cache-Control": "public, max-age=31536000, immutable", "ETag": asset.etag,
                   "Vary": "Accept-Encoding"}
        if request.headers.get("If-None-Match") == asset.etag:
            return web.Response(status=304, headers=headers)
        body = asset.raw
        if "gzip" in request.headers.get("Accept-Encoding", ""):
            body, headers["Content-Encoding"] = asset.gzipped, "gzip"
        return web.Response(body=body, headers=headers, content_type="application/javascript", charset="utf-8")

    async def healthz(self, _request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "history": self.telemetry.ready.is_set()})

    # ------------------------------------------------------------------------ middleware

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if request.path in ("/login", "/healthz") or request.path.startswith("/static/"):
            return await handler(request)
        session = await self.sessions.get(request.cookies.get(COOKIE))
        if session is None:
            if request.path.startswith("/api/"):
                return web.json_response({"error": "not signed in"}, status=401)
            raise web.HTTPFound("/login")
        if request.method == "POST" and request.path.startswith("/api/") and \
                request.headers.get("X-Requested-With") != "hfai-web":
            return web.json_response({"error": "missing X-Requested-With: hfai-web"}, status=403)
        request[SESSION_KEY] = session
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        """An error as JSON for the API (the pages' scripts read it), as a page of the site for
        what a browser opens (a job's page, a log download, the usage CSV); no route: a page too."""
        try:
            return await handler(request)
        except HfaiError as e:
            if request.path.startswith("/api/"):
                return web.json_response({"error": str(e), "code": e.code}, status=_status(e))
            return _error_page(request, _status(e), str(e))
        except web.HTTPNotFound:
            if request.path.startswith("/api/"):
                return web.json_response({"error": f"no such endpoint: {request.path}", "code": "not_found"},
                                         status=404)
            return _error_page(request, 404, f"There is no page at {request.path}.")

    # ------------------------------------------------------------------------ sign-in

    async def login_form(self, _request: web.Request) -> web.Response:
        return web.Response(text=pages.login_page(), content_type="text/html")

    async def login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        upload = form.get("file")
        text = str(form.get("creds") or "")
        if hasattr(upload, "file") and not text.strip():
            text = upload.file.read(64 * 1024).decode(errors="replace")  # type: ignore[union-attr]
        try:
            session = await self.sessions.sign_in(text)
        except HfaiError as e:
            return web.Response(text=pages.login_page(str(e)), content_type="text/html", status=_status(e))
        resp = web.HTTPFound("/jobs")
        resp.set_cookie(COOKIE, session.id, httponly=True, samesite="Strict", path="/")
        raise resp

    async def logout(self, request: web.Request) -> web.StreamResponse:
        await self.sessions.sign_out(request.cookies.get(COOKIE, ""))
        resp = web.HTTPFound("/login")
        resp.del_cookie(COOKIE, path="/")
        raise resp

    # ------------------------------------------------------------------------ pages

    def _page(self, render):
        async def handler(request: web.Request) -> web.Response:
            return web.Response(text=render(request[SESSION_KEY].user, self.config.web.poll_s),
                                content_type="text/html")

        return handler

    async def job_page(self, request: web.Request) -> web.Response:
        """A job's page, or a job array's (``hfai status ARRAY``'s): the reference is looked up as the
        CLI does, a job first, then an array by id or name; neither: a 404 page."""
        from hfai.api import arrays

        session = _session(request)
        [target] = await arrays.resolve(session.api, [request.match_info["id"]])
        if target.is_array:
            first = target.jobs[0]
            text = pages.array_page(session.user, target.array_id, self.config.web.poll_s,
                                    name=arrays.array_name(first), owner=first.spec.user)
            return web.Response(text=text, content_type="text/html")
        job = target.jobs[0]
        text = pages.job_page(session.user, job.id, self.config.web.poll_s, name=job.spec.name, owner=job.spec.user,
                              may_act=_may_act(session, job.spec.user))
        return web.Response(text=text, content_type="text/html")

    # ------------------------------------------------------------------------ JSON

    async def api_jobs(self, request: web.Request) -> web.Response:
        q = request.query
        jobs = await _session(request).api.list(request=ListRequest(history=LIST_HISTORY))
        rows = views.job_rows(jobs, user=q.get("user", ""), state=q.get("state", ""), priority=q.get("priority", ""),
                              name=q.get("name", ""), sort=q.get("sort", "submitted"), desc=q.get("desc", "1") == "1")
        return web.json_response({"jobs": rows})

    async def api_job(self, request: web.Request) -> web.Response:
        session = _session(request)
        job = await session.api.status(request.match_info["id"])
        now = time.time()
        end = job.ended_ts if job.state.final and job.ended_ts else now
        start = min([e.ts for e in job.history] + [end])
        segments, _ = job_timeline(job, end)
        held = sorted({n for s in segments for n in s.nodes}, key=_node_order)
        others = [j for j in await session.api.list() if j.id != job.id]  # who held its nodes around it
        tl = timeline([job, *others], start, end, held, only=held)
        samples = {n: self.telemetry.of(n) for s in segments for n in s.nodes}
        return web.json_response({**views.job_detail(job), "may_act": _may_act(session, job.spec.user),
                                  "timeline": tl.as_json(),
                                  "gpu": job_gpu(samples, [(s.nodes, s.start, s.end) for s in segments])})

    async def api_array(self, request: web.Request) -> web.Response:
        """A job array: the line `hfai status ARRAY` prints about it, and its members' rows in index order."""
        from hfai.api import arrays
        from hfai.api.client import JobFilter

        session, ref = _session(request), request.match_info["id"]
        target = arrays.find_array(await session.api.jobs(JobFilter.of(finished=True)), ref, session.user)
        if target is None:
            raise NotFound(f"no job array with id or name {ref!r}")
        return web.json_response({"array_id": target.array_id, "summary": arrays.summary(target),
                                  "jobs": [views.job_row(j) for j in target.jobs]})

    async def api_stop(self, request: web.Request) -> web.Response:
        job = await _session(request).api.stop(request.match_info["id"])
        return web.json_response(views.job_row(job))

    async def api_log(self, request: web.Request) -> web.Response:
        rank, offset = _int(request.match_info["rank"], "rank"), _int(request.query.get("offset", "0"), "offset")
        chunk = await _session(request).api.log_chunk(request.match_info["id"], rank, offset)
        return web.json_response({"data": chunk.data.decode(errors="replace"), "offset": chunk.offset + len(chunk.data),
                                  "size": chunk.size, "exists": chunk.exists})

    async def log_download(self, request: web.Request) -> web.StreamResponse:
        api, job_id = _session(request).api, request.match_info["id"]
        rank = _int(request.match_info["rank"], "rank")
        first = await api.log_chunk(job_id, rank, 0)  # refused here, before any byte is sent, if not theirs
        resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8",
                                           "Content-Disposition": f'attachment; filename="{job_id}-rank{rank}.log"'})
        await resp.prepare(request)
        chunk, sent = first, 0
        while chunk.data and sent < MAX_DOWNLOAD_BYTES:
            await resp.write(chunk.data)
            sent += len(chunk.data)
            chunk = await api.log_chunk(job_id, rank, chunk.offset + len(chunk.data))
        await resp.write_eof()
        return resp

    async def api_nodes(self, request: web.Request) -> web.Response:
        """Every node's row, a nodes × time heat map of the last hour, and one node's GPUs
        (``?node=``, else the first node)."""
        api = _session(request).api
        infos, jobs = await api.nodes(), await api.list(request=ListRequest(history=0, include_finished=False))
        now = time.time()
        since, _label = _window_start(now, int(self.config.web.telemetry_max_age_s), [], self.telemetry.first_ts())
        names = {j.id: j.spec.name for j in jobs}
        rows = [views.node_row(info, now, names) for info in sorted(infos, key=lambda i: _node_order(i.record.name))]
        order = [r["name"] for r in rows]
        picked = request.query.get("node", "")
        if picked not in order:
            picked = order[0] if order else ""
        samples = {n: self.telemetry.of(n) for n in order}
        return web.json_response({
            "nodes": rows, "history_ready": self.telemetry.ready.is_set(), "since": since, "now": now,
            "heat": heat_map(samples, order, since, now, bucket_s=max(5.0, (now - since) / 60)),
            "picked": picked,
            "gpus": gpu_lines(samples.get(picked, []), since) if picked else {"util": [], "mem": []}})

    async def api_cluster(self, request: web.Request) -> web.Response:
        window = _int(request.query.get("window", "3600"), "window")
        if window not in WINDOWS:
            raise InvalidRequest(f"window must be one of {sorted(WINDOWS)} seconds, not {window}")
        api = _session(request).api
        jobs, nodes, settings = await api.list(), await api.nodes(), await api.settings()
        now = time.time()
        since, label = _window_start(now, window, jobs, self.telemetry.first_ts())
        summary = views.cluster_summary(jobs, nodes, settings.quotas, now, settings.quota_needed_above)
        queue, used = cluster_series(jobs, since, now, points=120)
        util = self._cluster_util(max(since, now - self.config.web.telemetry_max_age_s), max(5.0, (now - since) / 120))
        summary["series"] = {"t0": since, "t1": now, "label": label,
                             **{k: {"ts": [t for t, _ in pts], "v": [round(v, 3) for _, v in pts]}
                                for k, pts in (("queue", queue), ("used", used),
                                               ("util", [(t, v * 100.0) for t, v in util]))}}
        rows = sorted((n.record.name for n in nodes), key=_node_order)
        summary["timeline"] = timeline(jobs, since, now, rows).as_json()
        return web.json_response(summary)

    def _cluster_util(self, since: float, bucket_s: float) -> list[tuple[float, float]]:
        """Mean GPU utilisation of all nodes per ``bucket_s`` (0-1), from the telemetry history."""
        buckets: dict[int, list[float]] = {}
        for node in list(self.telemetry.samples):
            for s in self.telemetry.of(node):
                if s.ts >= since and s.util:
                    buckets.setdefault(int(s.ts // bucket_s), []).append(sum(s.util) / len(s.util) / 100.0)
        return [((k + 0.5) * bucket_s, sum(v) / len(v)) for k, v in sorted(buckets.items())]

    async def _usage_rows(self, request: web.Request) -> tuple[UsageRow, ...]:
        days = _int(request.query.get("days", "7"), "days")
        if not 1 <= days <= 366:
            raise InvalidRequest("days must be 1..366")
        return await _session(request).api.usage(time.time() - days * 86400.0)

    async def api_usage(self, request: web.Request) -> web.Response:
        rows = await self._usage_rows(request)
        return web.json_response({
            "rows": [{"day": r.day, "user": r.user, "group": r.group, "priority": views.Priority.label(r.priority),
                      "gpu_hours": r.gpu_hours, "runs": r.runs} for r in rows],
            "totals": {k: totals(rows, k) if k != "priority" else
                       {views.Priority.label(int(p)): h for p, h in totals(rows, k).items()}
                       for k in ("user", "group", "priority")}})

    async def usage_csv(self, request: web.Request) -> web.Response:
        rows = await self._usage_rows(request)
        return web.Response(text="\n".join(csv_lines(rows)) + "\n", content_type="text/csv",
                            headers={"Content-Disposition": 'attachment; filename="hfai-usage.csv"'})


def _session(request: web.Request) -> Session:
    return request[SESSION_KEY]


def _error_page(request: web.Request, status: int, text: str) -> web.Response:
    """The site's page for an error, with its navigation when someone is signed in."""
    session = request.get(SESSION_KEY)
    page = pages.error_page(_TITLES.get(status, "Error"), text, session.user if session is not None else "")
    return web.Response(status=status, text=page, content_type="text/html")


def _window_start(now: float, window: int, jobs, first_sample: float | None) -> tuple[float, str]:
    """Where the cluster page's charts begin and what to call it: the window, or (on a cluster
    younger than it) a little before the earliest event or heartbeat kept, so that a new
    cluster's few minutes are not a sliver at the right of an empty hour."""
    since = now - window
    firsts = [j.history[0].ts for j in jobs if j.history] + ([first_sample] if first_sample else [])
    earliest = min(firsts, default=now)
    if earliest - since < 60:
        return since, WINDOWS.get(window, "")
    start = max(since, earliest - max(30.0, (now - earliest) * 0.05))
    first = time.strftime("%H:%M", time.gmtime(earliest))
    return start, f"{WINDOWS.get(window, 'window')} (nothing kept before {first} UTC)"


def _node_order(name: str) -> tuple[str, int]:
    """node-2 before node-10."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, -1)


def _may_act(session: Session, owner: str) -> bool:
    """Whether the controller would let this viewer stop the job and read its logs (it checks again)."""
    return session.operator or session.user == owner


def _int(text: str, what: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise InvalidRequest(f"{what} must be a whole number, not {text[:20]!r}") from None
