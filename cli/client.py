"""A small asyncio client of the controller API.

Used by the CLI, the tests and the benchmarks. ``ErrorReply`` comes back as the matching typed
exception from :mod:`hfai.protocol.errors`.

Who the client is comes from its credentials file, never from a name it claims: ``HFAI_USER``
(or the login name) only picks which file under ``creds_dir`` to present, and the name and role
the client then uses are the ones signed into that file's JWT. The server refuses any subject that
JWT does not allow, so a forged name gets :class:`Forbidden`, not someone else's jobs.
"""

from __future__ import annotations

import asyncio
import getpass
import os
from dataclasses import replace
from pathlib import Path

import nats.errors
from nats.aio.client import Client

from hfai import _nats
from hfai.config import Config, hfai_home
from hfai.protocol import decode, encode, names
from hfai.protocol.errors import Forbidden, Unavailable, error_for_code
from hfai.protocol.types import (
    DrainRequest,
    ErrorReply,
    JobList,
    JobRecord,
    JobReply,
    JobRequest,
    JobSpec,
    ListRequest,
    LogChunk,
    LogRequest,
    NodeInfo,
    NodesReply,
    NodesRequest,
    QuotaEntry,
    QuotaSetRequest,
    QuotasRequest,
    SettingsReply,
    StopRequest,
    SubmitRequest,
    UsageReply,
    UsageRequest,
    UsageRow,
)


def current_user() -> str:
    return os.environ.get("HFAI_USER") or getpass.getuser()


def creds_dir(config: Config) -> Path:
    """Where users' credentials files are: ``[nats] creds_dir``, by default ``$HFAI_HOME/creds``."""
    return Path(config.nats.creds_dir or hfai_home() / "creds")


def creds_path(config: Config, user: str) -> Path:
    """The credentials file a CLI of ``user`` presents: ``[nats] creds`` if set, else
    ``<creds_dir>/<user>.creds`` (see :func:`creds_dir`)."""
    if config.nats.creds:
        return Path(config.nats.creds)
    return creds_dir(config) / f"{names.check_token('user name', user)}.creds"


def identity(creds: Path) -> tuple[str, bool]:
    """(user name, operator?) signed into a credentials file."""
    from hfai.auth import jwt, roles

    try:
        claims = jwt.claims(jwt.parse_creds(creds.read_text())[0])
    except PermissionError:
        raise Forbidden(f"cannot read the credentials file {creds} (it is not yours?)") from None
    name = names.check_token("user name", str(claims.get("name", "")))
    return name, roles.is_operator(roles.from_claims(claims["nats"]), name)


class ApiClient:
    def __init__(self, config: Config, user: str | None = None):
        self.config = config
        self.user = names.check_token("user name", user or current_user())
        self.creds = creds_path(config, self.user)
        self.operator = False
        if self.creds.exists():
            self.user, self.operator = identity(self.creds)
        self._nc: Client | None = None
        self._refused: dict[str, set[asyncio.Future]] = {}

    async def __aenter__(self) -> ApiClient:
        creds = str(self.creds) if self.creds.exists() else ""
        try:
            self._nc = await _nats.connect(self.config, name=f"hfai-cli-{self.user}", reconnect=False, creds=creds,
                                           on_error=self._on_error)
        except Forbidden as e:
            if creds:
                raise
            raise Forbidden(f"{e} (looked for {self.creds})") from None
        return self

    async def _on_error(self, e: Exception) -> None:
        # The server answers a publish outside our permissions with an asynchronous error, not a
        # reply: turn it into Forbidden for the request waiting on that subject.
        text = str(e)
        if "permissions violation" in text.lower():
            for subject, waiting in self._refused.items():
                if f'"{subject}"' in text:
                    for fut in waiting:
                        if not fut.done():
                            fut.set_result(text)

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()
            self._nc = None

    async def call(self, verb: str, request, expect: type):
        # An operator sends everything on the operator subject: its verbs, and others' jobs.
        return await self._request(names.api_subject(self.user, verb, operator=self.operator), encode(request), expect)

    @property
    def _conn(self) -> Client:
        if self._nc is None:
            raise RuntimeError("ApiClient is used as `async with ApiClient(...) as api:`")
        return self._nc

    async def _request(self, subject: str, payload: bytes, expect: type):
        refused = asyncio.get_running_loop().create_future()
        self._refused.setdefault(subject, set()).add(refused)
        ask = asyncio.ensure_future(self._conn.request(subject, payload, timeout=self.config.nats.request_timeout_s))
        try:
            await asyncio.wait({ask, refused}, return_when=asyncio.FIRST_COMPLETED)
            if refused.done() and not ask.done():
                raise Forbidden(f"the cluster does not let {self.user} send {subject}"
                                + ("" if self.operator else " (only operators may, or it is another user's)"))
            msg = ask.result()
        except nats.errors.NoRespondersError:
            raise Unavailable("no controller is serving the API; is `hfai-controller` running?") from None
        except (TimeoutError, nats.errors.TimeoutError):
            raise Unavailable(f"no answer within {self.config.nats.request_timeout_s:g}s on {subject}") from None
        finally:
            if not ask.done():
                ask.cancel()
            waiting = self._refused.get(subject, set())
            waiting.discard(refused)
            if not waiting:
                self._refused.pop(subject, None)
            refused.cancel()
        reply = decode(msg.data, (expect, ErrorReply))
        if isinstance(reply, ErrorReply):
            raise error_for_code(reply.code)(reply.message)
        return reply

    async def raw_request(self, subject: str, payload: bytes) -> bytes:
        """Send arbitrary bytes (tests use it to feed garbage to the API)."""
        msg = await self._conn.request(subject, payload, timeout=self.config.nats.request_timeout_s)
        return msg.data

    # ------------------------------------------------------------------------------- verbs

    async def submit(self, spec: JobSpec, force: bool = False) -> JobRecord:
        return (await self.call(names.VERB_SUBMIT, SubmitRequest(spec=spec, force=force), JobReply)).job

    async def list(self, all_users: bool = True, include_finished: bool = True) -> tuple[JobRecord, ...]:
        """Every matching job, fetched page by page (each reply is bounded in size)."""
        jobs: list[JobRecord] = []
        req = ListRequest(all_users=all_users, include_finished=include_finished)
        while True:
            page = await self.call(names.VERB_LIST, req, JobList)
            jobs.extend(page.jobs)
            if not (page.more and page.jobs):
                return tuple(jobs)
            last = page.jobs[-1]
            req = replace(req, after_ts=last.submit_ts, after_id=last.id)

    async def status(self, job: str) -> JobRecord:
        return (await self.call(names.VERB_STATUS, JobRequest(job=job), JobReply)).job

    async def stop(self, job: str) -> JobRecord:
        return (await self.call(names.VERB_STOP, StopRequest(job=job), JobReply)).job

    async def nodes(self) -> tuple[NodeInfo, ...]:
        """Every node, fetched page by page (each reply is bounded in size)."""
        nodes: list[NodeInfo] = []
        req = NodesRequest()
        while True:
            page = await self.call(names.VERB_NODES, req, NodesReply)
            nodes.extend(page.nodes)
            if not (page.more and page.nodes):
                return tuple(nodes)
            req = NodesRequest(after=page.nodes[-1].record.name)

    async def settings(self) -> SettingsReply:
        return await self.call(names.VERB_SETTINGS, QuotasRequest(), SettingsReply)

    async def set_quota(self, user: str, priority: int, group: str, nodes: int) -> SettingsReply:
        entry = QuotaEntry(user=user, priority=priority, group=group, nodes=nodes)
        return await self.call(names.VERB_QUOTA_SET, QuotaSetRequest(entry=entry), SettingsReply)

    async def drain(self, node: str, drain: bool = True, reason: str = "") -> SettingsReply:
        return await self.call(names.VERB_DRAIN, DrainRequest(node=node, drain=drain, reason=reason), SettingsReply)

    async def log_chunk(self, job_id: str, rank: int, offset: int) -> LogChunk:
        """A slice of one rank's log, relayed by the controller (only owners and operators)."""
        return await self.call(names.VERB_LOGS, LogRequest(job_id=job_id, rank=rank, offset=offset), LogChunk)

    async def usage(self, since_ts: float, until_ts: float = 0.0) -> tuple[UsageRow, ...]:
        """GPU-hours per UTC day, user, group and priority (everyone's, like the queue)."""
        reply = await self.call(names.VERB_USAGE, UsageRequest(since_ts=since_ts, until_ts=until_ts), UsageReply)
        return reply.rows
