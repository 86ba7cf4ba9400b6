"""A small asyncio client of the controller API and the agents' log service.

Used by the CLI, the tests and the benchmarks. ``ErrorReply`` comes back as the matching typed
exception from :mod:`hfai.protocol.errors`.
"""

from __future__ import annotations

import asyncio
import getpass
import os
from dataclasses import replace

import nats.errors

from hfai import _nats
from hfai.config import Config
from hfai.protocol import decode, encode, names
from hfai.protocol.errors import Unavailable, error_for_code
from hfai.protocol.types import (
    DrainRequest,
    QuotaEntry,
    QuotaSetRequest,
    QuotasRequest,
    SettingsReply,
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
    StopRequest,
    SubmitRequest,
)


def current_user() -> str:
    return os.environ.get("HFAI_USER") or getpass.getuser()


class ApiClient:
    def __init__(self, config: Config, user: str | None = None):
        self.config = config
        self.user = names.check_token("user name", user or current_user())
        self._nc = None

    async def __aenter__(self) -> ApiClient:
        self._nc = await _nats.connect(self.config, name=f"hfai-cli-{self.user}", reconnect=False)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()
            self._nc = None

    async def call(self, verb: str, request, expect: type):
        return await self._request(names.api_subject(self.user, verb), encode(request), expect)

    async def _request(self, subject: str, payload: bytes, expect: type):
        try:
            msg = await self._nc.request(subject, payload, timeout=self.config.nats.request_timeout_s)
        except nats.errors.NoRespondersError:
            raise Unavailable("no controller is serving the API; is `hfai-controller` running?") from None
        except (nats.errors.TimeoutError, asyncio.TimeoutError):
            raise Unavailable(f"no answer within {self.config.nats.request_timeout_s:g}s on {subject}") from None
        reply = decode(msg.data, (expect, ErrorReply))
        if isinstance(reply, ErrorReply):
            raise error_for_code(reply.code)(reply.message)
        return reply

    async def raw_request(self, subject: str, payload: bytes) -> bytes:
        """Send arbitrary bytes (tests use it to feed garbage to the API)."""
        msg = await self._nc.request(subject, payload, timeout=self.config.nats.request_timeout_s)
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

    async def log_chunk(self, node: str, job_id: str, rank: int, offset: int) -> LogChunk:
        req = LogRequest(job_id=job_id, rank=rank, offset=offset)
        return await self._request(names.agent_logs_subject(node), encode(req), LogChunk)
