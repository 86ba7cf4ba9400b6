"""A small asyncio client of the controller API.

Used by the CLI, the web service, storage's client, :mod:`hfai.client`, the tests and the
benchmarks. ``ErrorReply`` comes back as the matching typed exception from :mod:`hfai.protocol.errors`.

Who the client is comes from its credentials file, never from a name it claims: ``HFAI_USER``
(or the login name) only picks which file under ``creds_dir`` to present, and the name and role
the client then uses are the ones signed into that file's JWT. The server refuses any subject that
JWT does not allow, so a forged name gets :class:`Forbidden`, not someone else's jobs.
"""

from __future__ import annotations

# isort: off
from hfai.api import _light_nats  # noqa: F401  (first: nats-py without aiohttp, see there)
import asyncio
import fnmatch
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Self, TypeVar

import nats.errors
from nats.aio.client import Client
# isort: on

from hfai.api.config import creds_path, current_user
from hfai.core import nats as _nats
from hfai.core.config import Config
from hfai.protocol import decode, encode, names, verbs
from hfai.protocol._lazy import frozen_dataclass
from hfai.protocol.errors import ErrorSub, Forbidden, InvalidRequest, Unavailable, error_of
from hfai.protocol.types import (
    ChainState,
    DrainRequest,
    ErrorReply,
    JobRecord,
    JobRequest,
    JobSpec,
    ListRequest,
    LogChunk,
    LogRequest,
    NodeInfo,
    NodesRequest,
    QuotaEntry,
    QuotaSetRequest,
    QuotasRequest,
    SettingsReply,
    StopRequest,
    StoreHealth,
    SubmitRequest,
    UsageRequest,
    UsageRow,
)
from hfai.protocol.verbs import Verb

if TYPE_CHECKING:
    from nats.aio.subscription import Subscription

log = logging.getLogger(__name__)

#: ``--state`` values besides the ChainState ones: every state that is not final.
ACTIVE = "active"


@frozen_dataclass  # made at first use (hfai.protocol._lazy): `hfai status` does without it
class JobFilter:
    """Which jobs ``hfai ps`` (and :func:`hfai.client.list_experiments`) show.

    The API's ``list`` filters by "mine or everyone's" and "finished too or not" (server side);
    other users, states, names and holds are matched here, on the listed records (client side).
    ``users`` empty: everyone's; ``states`` empty: every active job, or every job with ``finished``.
    """

    users: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    finished: bool = False

    def __post_init__(self):
        known = {s.value for s in ChainState} | {ACTIVE}
        for state in self.states:
            if state not in known:
                raise InvalidRequest(f"unknown state {state[:40]!r}: use {', '.join(sorted(known))}")

    @classmethod
    def of(cls, users: Iterable[str] = (), states: Iterable[str] = (), names: Iterable[str] = (),
           finished: bool = False) -> JobFilter:
        return cls(users=tuple(users), states=tuple(s.strip().lower() for s in states), names=tuple(names),
                   finished=finished)

    def _wanted_states(self) -> set[ChainState]:
        if not self.states:
            return set(ChainState) if self.finished else {s for s in ChainState if not s.final}
        out = set()
        for name in self.states:
            out |= {s for s in ChainState if not s.final} if name == ACTIVE else {ChainState(name)}
        return out

    def request(self, me: str) -> ListRequest:
        """The server-side part: only my jobs when I am the only user asked for; finished jobs
        only when a state asked for is final."""
        return ListRequest(all_users=set(self.users) != {me},
                           include_finished=any(s.final for s in self._wanted_states()),
                           history=LIST_HISTORY)

    def match(self, job: JobRecord) -> bool:
        """The client-side part (pure)."""
        return ((not self.users or job.spec.user in self.users) and job.state in self._wanted_states()
                and (not self.names or any(fnmatch.fnmatchcase(job.spec.name, p) for p in self.names)))


#: History lines per job a list asks for: the run time of a finished job needs the last two.
LIST_HISTORY = 2

Req = TypeVar("Req")
Rep = TypeVar("Rep")


def try_plan(deadline_s: float, try_s: float, max_copies: int) -> tuple[tuple[float, int], ...]:
    """When to send copies of a repeatable request: (seconds after the first, how many) pairs. One
    at 0, then at every ``try_s`` without an answer as many again as were sent so far (1, 1, 2,
    4, ...), up to ``max_copies`` in all and only while before ``deadline_s``. NATS hands each copy to
    a random member of the replicas' queue group, so with one of two replicas hung the chance that
    every copy reached it halves with each copy sent: 1/16 after 2 s, 1/65,536 after 4 s. Pure."""
    if try_s <= 0 or max_copies <= 1:
        return ((0.0, 1),)
    plan, sent, k = [(0.0, 1)], 1, 1
    while sent < max_copies and k * try_s < deadline_s:
        n = min(sent, max_copies - sent)
        plan.append((k * try_s, n))
        sent, k = sent + n, k + 1
    return tuple(plan)


def identity(creds: Path | _nats.Credentials) -> tuple[str, bool]:
    """(user name, operator?) signed into a credentials file (or credentials read already)."""
    from hfai.auth import roles

    if not isinstance(creds, _nats.Credentials):
        creds = _nats.read_credentials(creds)
    claims = creds.claims
    name = names.check_token("user name", str(claims.get("name", "")))
    return name, roles.is_operator(roles.from_claims(claims["nats"]), name)


class ApiClient:
    def __init__(self, config: Config, user: str | None = None):
        self.config = config
        self.user = names.check_token("user name", user or current_user())
        self.creds = creds_path(config, self.user)
        self.operator = False
        # Read once: who the client is, and what it presents when it connects.
        self._credentials: _nats.Credentials | None = None
        if self.creds.exists():
            self._credentials = _nats.read_credentials(self.creds)
            self.user, self.operator = identity(self._credentials)
        self._nc: Client | None = None
        self._left: list[Client] = []  # connections to servers left as cut off (closed with the client)
        self._refused: dict[str, set[asyncio.Future]] = {}

    async def __aenter__(self) -> Self:
        creds = self._credentials or ""
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
        for subject, waiting in self._refused.items():
            if _nats.denies(e, subject):
                for fut in waiting:
                    if not fut.done():
                        fut.set_result(str(e))

    async def __aexit__(self, *exc) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        """Whether the connection is up (False before ``__aenter__``, after ``close`` or once the
        server dropped it, e.g. for revoked credentials: this client never reconnects)."""
        return self._nc is not None and self._nc.is_connected

    async def close(self) -> None:
        for nc in (*self._left, self._nc):
            if nc is not None:
                await nc.close()
        self._nc, self._left = None, []

    async def call(self, verb: Verb[Req, Rep], request: Req, *, timeout: float | None = None) -> Rep:
        """One API request (``verb``: an entry of :mod:`hfai.protocol.verbs`), its typed reply;
        sent again or elsewhere as the verb's ``repeatable`` and ``movable`` allow. ``timeout``:
        seconds to wait for it, other than ``[nats] request_timeout_s``. A refusal raises the
        typed error the reply names (:func:`hfai.protocol.errors.error_of`)."""
        verb.check(request)
        if isinstance(request, SubmitRequest) and not request.request_id:
            # Named, so that a copy sent through another server makes no second job.
            request = replace(request, request_id=os.urandom(8).hex())
        # An operator sends everything on the operator subject: its verbs, and others' jobs.
        return await self.request(names.api_subject(self.user, verb.name, operator=self.operator), request,
                                  verb.reply, timeout=timeout, repeatable=verb.repeatable, movable=verb.movable)

    async def request(self, subject: str, request: object, reply: type[Rep], *, timeout: float | None = None,
                      repeatable: bool = False, movable: bool = False) -> Rep:
        """One request on any subject this client's credentials may publish (a service other
        than the controllers' API: the storage service, an agent's operations), its reply decoded
        as ``reply``; ``timeout``, ``repeatable`` and ``movable`` as for :meth:`call` and
        :meth:`_request`."""
        try:
            payload = encode(request)
        except OverflowError:
            # The CLI bounds what a user types (hfai.protocol.limits); this is the last line for
            # a caller of the Python API: one typed error, not msgpack's traceback.
            raise InvalidRequest(f"{subject.rsplit('.', 1)[-1]}: a number in the request is too large to send "
                                 "(the wire carries 64-bit integers)") from None
        return await self._request(subject, payload, reply, repeatable=repeatable, movable=movable,
                                   timeout_s=timeout)

    async def subscribe(self, subject: str, received: Callable[[bytes], None]) -> Subscription:
        """Hand each message on ``subject`` (its bytes) to ``received``, from when this returns on:
        the server has the subscription by then. The stream of a service's session (hfai exec's
        output); ``unsubscribe()`` the result when done."""

        async def deliver(msg) -> None:
            received(msg.data)

        sub = await self._conn.subscribe(subject, cb=deliver)
        await self._conn.flush()
        return sub

    async def publish(self, subject: str, message: object) -> None:
        """Send a message on ``subject``, no reply awaited (the next part of a session's stream)."""
        await self._conn.publish(subject, encode(message))

    @property
    def max_payload(self) -> int:
        """The most bytes one message may carry, as the NATS server announced it."""
        return self._conn.max_payload

    @property
    def _conn(self) -> Client:
        if self._nc is None:
            raise RuntimeError("ApiClient is used as `async with ApiClient(...) as api:`")
        return self._nc

    async def _request(self, subject: str, payload: bytes, expect: type[Rep], repeatable: bool = False,
                       movable: bool = False, timeout_s: float | None = None) -> Rep:
        """One request, answered by whichever copy answers first. A ``repeatable`` one is sent
        again on :func:`try_plan`'s schedule (see hfai.protocol.verbs); every copy waits until the
        same deadline (``timeout_s``, else ``[nats] request_timeout_s``), so a slow but live
        replica's answer still counts. A ``repeatable`` or ``movable`` one is also sent through
        another server if this one seems cut off (:meth:`_move`)."""
        nats_config = self.config.nats
        deadline_s = nats_config.request_timeout_s if timeout_s is None else timeout_s
        plan = try_plan(deadline_s, nats_config.request_try_s, nats_config.request_copies) if repeatable else \
            ((0.0, 1),)
        loop = asyncio.get_running_loop()
        refused = loop.create_future()
        self._refused.setdefault(subject, set()).add(refused)
        asks: set[asyncio.Future] = set()
        try:
            msg = await self._first_answer(subject, payload, plan, deadline_s, asks, refused, movable or repeatable)
        finally:
            for ask in asks:
                ask.cancel()
            waiting = self._refused.get(subject, set())
            waiting.discard(refused)
            if not waiting:
                self._refused.pop(subject, None)
            refused.cancel()
        reply = decode(msg.data, (expect, ErrorReply))
        if isinstance(reply, ErrorReply):
            raise error_of(reply.code, reply.message, reply.sub)
        return reply

    async def _first_answer(self, subject: str, payload: bytes, plan: tuple[tuple[float, int], ...],
                            deadline_s: float, asks: set[asyncio.Future], refused: asyncio.Future,
                            movable: bool = False):
        """Send the copies ``plan`` says when it says (seconds after now), each waiting until
        ``deadline_s`` from now; the first reply.

        ``movable``: with other servers configured, no answer through this one within
        ``request_try_s`` (or no responders at all) may mean that this server is cut off from its
        cluster (its routes silently dropping what it forwards): :meth:`_move` then connects to
        another, and the copies go through both, the new ones with a deadline of their own."""
        loop = asyncio.get_running_loop()
        start, sent = loop.time(), 0
        todo = [(start + at, n, self._conn, start + deadline_s) for at, n in plan]
        try_s = self.config.nats.request_try_s
        move_at = start + try_s if movable and try_s > 0 and self._movable() else None
        moving: asyncio.Future | None = None
        no_responders = False
        while True:
            now = loop.time()
            while todo and todo[0][0] <= now:
                _, n, nc, ends = todo.pop(0)
                for _ in range(n):
                    asks.add(asyncio.ensure_future(nc.request(subject, payload, timeout=max(0.0, ends - now))))
                    sent += 1
            if move_at is not None and now >= move_at:
                move_at, moving = None, asyncio.ensure_future(self._move(check=not no_responders))
            if moving is not None and moving.done():
                there, moving = moving.result(), None
                if there is not None:
                    ends = now + deadline_s
                    todo = sorted([*todo, *((now + at, n, there, ends) for at, n in plan)], key=lambda t: t[0])
            waiting = {a for a in asks if not a.done()}
            if not waiting and not todo and moving is None and move_at is None:
                raise Unavailable(f"no answer within {deadline_s:g}s on {subject}"
                                  + (f" (asked {sent} times)" if sent > 1 else ""), sub=ErrorSub.NO_ANSWER)
            until = min([t[0] for t in todo[:1]] + ([move_at] if move_at is not None else []), default=None)
            done, _ = await asyncio.wait(waiting | {refused} | ({moving} if moving is not None else set()),
                                         timeout=None if until is None else max(0.0, until - now),
                                         return_when=asyncio.FIRST_COMPLETED)
            if refused.done():
                raise Forbidden(f"the cluster does not let {self.user} send {subject}"
                                + ("" if self.operator else " (only operators may, or it is another user's)"),
                                sub=ErrorSub.SUBJECT_DENIED)
            for ask in done:
                if ask is moving:
                    continue
                try:
                    return ask.result()
                except nats.errors.NoRespondersError:
                    # No controller behind this server; behind another, maybe (this one lost its
                    # routes): asked at once, without the check. Nowhere else to ask: none at all.
                    no_responders = True
                    if move_at is None and moving is None:
                        raise Unavailable("no controller is serving the API; is `hfai-controller` running?",
                                          sub=ErrorSub.NO_RESPONDERS) from None
                    move_at = now if move_at is not None else None
                except (TimeoutError, nats.errors.TimeoutError):
                    pass  # this copy's time is up; the others may still answer

    def _movable(self) -> bool:
        """Whether another configured server is left to move to."""
        return len(self._servers()) > 1 + len(self._left)

    def _servers(self) -> list[str]:
        return [u.strip() for u in self.config.nats.url.split(",") if u.strip()]

    async def _move(self, check: bool) -> Client | None:
        """A connection to another configured server if this one seems cut off from its cluster,
        which from then on carries this client's requests; None to stay.

        Where the credentials may ask JetStream (none, or a daemon's), the question the daemons'
        watch asks decides (hfai.core.cutoff.check: does the cluster behind this server answer?). A
        user's credentials may not ask it, nor anything else that only a server with its cluster
        answers: then the silence is the sign. Moving costs one connection, and what is sent again
        is only what may be (``repeatable``, or a submit named by its ``request_id``)."""
        from hfai.core import cutoff as _cutoff

        nc = self._conn
        here = nc.connected_url.netloc if nc.connected_url is not None else ""
        why = f"no answer within {self.config.nats.request_try_s:g}s"
        if check:
            creds = self._credentials or ""
            stream = _nats._check_stream(creds)
            if stream is not None or not creds:
                n = self.config.nats
                try:
                    why = await _cutoff.check(nc.jetstream(timeout=n.cutoff_timeout_s), n.cutoff_timeout_s, stream,
                                              n.cutoff_silent_s)
                except (nats.errors.Error, OSError) as e:  # an answer that refuses: the cluster is there
                    log.debug("JetStream check through %s: %s", here, e)
                    return None
                if not why:
                    return None  # the cluster answers: the controllers are slow, not the server cut off
        else:
            why = "no controller behind it"
        left = {here} | {c.connected_url.netloc for c in self._left if c.connected_url is not None}
        others = [u for u in self._servers() if _netloc(u) not in left]
        if not others:
            return None
        log.info("NATS server %s: %s; asking through %s too", here, why, ", ".join(others))
        try:
            moved = await _nats.connect(replace(self.config, nats=replace(self.config.nats, url=",".join(others))),
                                        name=f"hfai-cli-{self.user}", reconnect=False,
                                        creds=self._credentials or "", on_error=self._on_error)
        except (Unavailable, Forbidden) as e:
            log.info("no other NATS server to ask: %s", e)
            return None
        self._left.append(nc)
        self._nc = moved
        return moved

    async def raw_request(self, subject: str, payload: bytes) -> bytes:
        """Send arbitrary bytes (tests use it to feed garbage to the API)."""
        msg = await self._conn.request(subject, payload, timeout=self.config.nats.request_timeout_s)
        return msg.data

    # ------------------------------------------------------------------------------- verbs

    async def submit(self, spec: JobSpec, force: bool = False) -> JobRecord:
        return (await self.call(verbs.SUBMIT, SubmitRequest(spec=spec, force=force))).job

    async def list(self, all_users: bool = True, include_finished: bool = True,
                   request: ListRequest | None = None) -> tuple[JobRecord, ...]:
        """Every matching job, fetched page by page (each reply is bounded in size)."""
        jobs: list[JobRecord] = []
        req = request or ListRequest(all_users=all_users, include_finished=include_finished)
        while True:
            page = await self.call(verbs.LIST, req)
            jobs.extend(page.jobs)
            if not (page.more and page.jobs):
                return tuple(jobs)
            last = page.jobs[-1]
            req = replace(req, after_ts=last.submit_ts, after_id=last.id)

    async def status(self, job: str) -> JobRecord:
        return (await self.call(verbs.STATUS, JobRequest(job=job))).job

    async def stop(self, job: str) -> JobRecord:
        return (await self.call(verbs.STOP, StopRequest(job=job))).job

    async def nodes(self) -> tuple[NodeInfo, ...]:
        """Every node, fetched page by page (each reply is bounded in size)."""
        return (await self.nodes_and_store())[0]

    async def nodes_and_store(self) -> tuple[tuple[NodeInfo, ...], StoreHealth | None]:
        """Every node, and the NATS store's health as the controller that sent the last page sees
        it (None from a controller that does not probe)."""
        nodes: list[NodeInfo] = []
        req = NodesRequest()
        while True:
            page = await self.call(verbs.NODES, req)
            nodes.extend(page.nodes)
            if not (page.more and page.nodes):
                return tuple(nodes), page.store
            req = NodesRequest(after=page.nodes[-1].record.name)

    async def settings(self) -> SettingsReply:
        return await self.call(verbs.SETTINGS, QuotasRequest())

    async def set_quota(self, user: str, priority: int, group: str, nodes: int) -> SettingsReply:
        entry = QuotaEntry(user=user, priority=priority, group=group, nodes=nodes)
        return await self.call(verbs.QUOTA_SET, QuotaSetRequest(entry=entry))

    async def drain(self, node: str, drain: bool = True, reason: str = "") -> SettingsReply:
        return await self.call(verbs.DRAIN, DrainRequest(node=node, drain=drain, reason=reason))

    async def jobs(self, only: JobFilter) -> tuple[JobRecord, ...]:
        """The jobs ``only`` lets through: filtered by the server where the API can, else here."""
        return tuple(j for j in await self.list(request=only.request(self.user)) if only.match(j))

    async def log_chunk(self, job_id: str, rank: int, offset: int, max_bytes: int = 65536,
                        timestamps: bool = False) -> LogChunk:
        """A slice of one rank's log, relayed by the controller (only owners and operators);
        ``timestamps``: with the time the node read each line that starts in it (``line_ts``)."""
        req = LogRequest(job_id=job_id, rank=rank, offset=offset, max_bytes=max_bytes, timestamps=timestamps)
        return await self.call(verbs.LOGS, req)

    async def tail_offset(self, job_id: str, rank: int, lines: int, step: int = 65536) -> int:
        """Where the last ``lines`` lines of one rank's log begin (its size for 0 lines). Reads
        backwards from the end ``step`` bytes at a time, so a long log is not fetched whole. A
        last line without its newline yet counts as a line."""
        size = (await self.log_chunk(job_id, rank, _END, max_bytes=1)).size
        if lines <= 0 or size == 0:
            return size
        end, tail = size, b""
        while end > 0:
            start = max(0, end - step)
            chunk = await self.log_chunk(job_id, rank, start, max_bytes=end - start)
            if not chunk.data:
                break
            tail = chunk.data[: end - start] + tail
            end = start
            at = _line_start(tail, lines)
            if at is not None:
                return end + at
        return 0

    async def read_log(self, job_id: str, rank: int, offset: int = 0) -> AsyncIterator[bytes]:
        """One rank's log from ``offset`` to its current end, chunk by chunk."""
        async for chunk in self.read_log_chunks(job_id, rank, offset):
            yield chunk.data

    async def read_log_chunks(self, job_id: str, rank: int, offset: int = 0,
                              timestamps: bool = False) -> AsyncIterator[LogChunk]:
        """As :meth:`read_log`, the chunks whole: with ``timestamps``, each with the time the node
        read each of its lines (``hfai logs --timestamps``: :class:`hfai.cli.render.LineStamper`)."""
        while True:
            chunk = await self.log_chunk(job_id, rank, offset, timestamps=timestamps)
            if not chunk.data:
                return
            yield chunk
            offset = chunk.offset + len(chunk.data)
            if offset >= chunk.size:
                return

    async def usage(self, since_ts: float, until_ts: float = 0.0) -> tuple[UsageRow, ...]:
        """GPU-hours per UTC day, user, group and priority (everyone's, like the queue)."""
        reply = await self.call(verbs.USAGE, UsageRequest(since_ts=since_ts, until_ts=until_ts))
        return reply.rows


def _netloc(url: str) -> str:
    """host:port of a configured server URL, as nats-py's ``connected_url.netloc`` says it."""
    from urllib.parse import urlparse

    return urlparse(url if "://" in url else f"nats://{url}").netloc


#: An offset past any log's end: the agent clamps it, so the reply carries just the size.
_END = 2**62


def _line_start(tail: bytes, lines: int) -> int | None:
    """The index in ``tail`` (the end of a log) where its last ``lines`` lines begin, or None if
    ``tail`` holds fewer lines than that (read further back). Pure."""
    pos = len(tail) - 1 if tail.endswith(b"\n") else len(tail)  # the final newline ends the last line
    for _ in range(lines):
        pos = tail.rfind(b"\n", 0, pos)
        if pos < 0:
            return None
    return pos + 1
