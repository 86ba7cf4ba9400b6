"""The API every controller replica serves on the queue group ``hfai-controller``.

Who calls is read from the subject, never from the payload: the user is its third token
(``hfai.api.<user>.<verb>``), and ``hfai.api.<user>.op.<verb>`` marks an operator. The NATS server
lets only that user's credentials publish there (hfai.auth.roles), so the subject is proof. Any
error becomes an ``ErrorReply``; nothing a client sends can stop the service.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.kv import KeyValue

from hfai.controller import transitions
from hfai.controller.node_pages import NodePages
from hfai.controller.nodes import NodeTracker
from hfai.controller.paging import paged_reply
from hfai.controller.policy import resolve_auto
from hfai.controller.transitions import apply_stop
from hfai.controller.validate import check_array, parse_dependency
from hfai.controller.views import job_view, quotas_of
from hfai.controller.waits import WaitBoard
from hfai.core import nats as _nats
from hfai.core.config import ControllerConfig, DevConfig
from hfai.kv import KVCache, cas_update, cas_value
from hfai.protocol import decode, encode, names, reasons, verbs
from hfai.protocol.codec import Encoded, pack
from hfai.protocol.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unavailable, error_of
from hfai.protocol.limits import MAX_NODES
from hfai.protocol.types import (
    AUTO_PRIORITY,
    JOB_DEV,
    ChainState,
    DrainedNodes,
    DrainRequest,
    ErrorReply,
    EstimateReply,
    EstimateRequest,
    HoldRequest,
    JobEvent,
    JobList,
    JobRecord,
    JobReply,
    JobRequest,
    JobSpec,
    ListRequest,
    LogChunk,
    LogRequest,
    NodesRequest,
    Priority,
    QuotaSetRequest,
    QuotasRequest,
    QuotaTable,
    RequeueRequest,
    RestrictedUsers,
    SettingsReply,
    StopRequest,
    StoreHealth,
    SubmitRequest,
    UpdateRequest,
    UsageReply,
    UsageRequest,
    evolve,
    watch_of,
)

log = logging.getLogger(__name__)

# Largest log slice relayed in one reply: well under NATS's 1 MiB max_payload.
MAX_LOG_CHUNK = 256 * 1024


@dataclass(frozen=True)
class Caller:
    """Who sent a request, as its subject proves it."""

    user: str
    operator: bool = False

    def may_act_on(self, job: JobRecord) -> bool:
        return self.operator or job.spec.user == self.user


def _submitted_id(user: str, request_id: str, part: object = None) -> str:
    """The id of the job a submission named ``request_id`` makes (``part``: an array member's
    index, or "array" for the array's id); "" without a name. Derived, not random, so that every
    copy of the request, at any replica, makes the same key and the bucket's create lets one win."""
    if not request_id:
        return ""
    import hashlib

    return hashlib.sha256(f"{user}\0{request_id}\0{part}".encode()).hexdigest()[:10]


#: The longest a job without a time limit may be assumed to run in an estimate (a year).
MAX_ASSUMED_RUN_S = 365 * 86400.0


class ApiService:
    def __init__(self, jobs_kv: KeyValue, jobs: KVCache[JobRecord], nodes: NodeTracker,
                 on_submit: Callable[[], None] | None = None, settings_kv: KeyValue | None = None,
                 settings: KVCache | None = None, config: ControllerConfig | None = None,
                 request: Callable[[str, bytes, float], Awaitable[bytes]] | None = None,
                 dev: DevConfig | None = None, waits: WaitBoard | None = None):
        self._kv = jobs_kv
        self._jobs = jobs
        # Why waiting jobs wait, as the leader last published it (controller/waits.py).
        self._waits = waits if waits is not None else WaitBoard({})  # none: nothing noted
        self._by_user = _ByUser(jobs)
        self._nodes = nodes
        self._node_pages = NodePages(nodes)
        self._on_submit = on_submit or (lambda: None)
        self._settings_kv = settings_kv
        self._settings = settings
        self._config = config or ControllerConfig()
        self._dev = dev or DevConfig()
        self._request = request  # NATS request/reply, to relay log requests to the agents
        # Each handler takes its verb's request type (hfai.protocol.verbs; hence Any) and answers
        # with its reply type, or that reply already encoded (list, nodes: paged).
        self._handlers: dict[str, Callable[[Caller, Any], Awaitable[object]]] = {
            verbs.SUBMIT.name: self.submit,
            verbs.LIST.name: self.list,
            verbs.STATUS.name: self.status,
            verbs.STOP.name: self.stop,
            verbs.NODES.name: self.nodes,
            verbs.QUOTA_SET.name: self.quota_set,
            verbs.SETTINGS.name: self.settings,
            verbs.DRAIN.name: self.drain,
            verbs.LOGS.name: self.logs,
            verbs.USAGE.name: self.usage_report,
            verbs.HOLD.name: self.hold,
            verbs.REQUEUE.name: self.requeue,
            verbs.UPDATE.name: self.update,
            verbs.ESTIMATE.name: self.estimate,
        }
        # Usage accounting (controller/usage_recorder.py), set by the controller service.
        self.usage: Callable[[UsageRequest, int], UsageReply] | None = None
        # The NATS store's health as this replica's probe sees it (controller/store_health.py),
        # set by the controller service; it rides on every `hfai nodes` reply.
        self.store_health: Callable[[], StoreHealth] | None = None

    async def handle(self, msg: Msg) -> None:
        """Serve one request message; always replies (if the caller gave a reply subject)."""
        await _nats.answer(msg, self._dispatch, "controller")

    async def _dispatch(self, subject: str, data: bytes) -> object:
        user, verb, operator = names.parse_api_subject(subject)
        names.check_token("user name", user)
        if verb not in self._handlers:
            raise InvalidRequest(f"unknown API verb {verb[:64]!r}; known: {', '.join(verbs.VERBS)}")
        return await self._handlers[verb](Caller(user=user, operator=operator), decode(data, verbs.VERBS[verb].request))

    @property
    def served(self) -> frozenset[str]:
        """The verbs this service answers (every one of hfai.protocol.verbs: a test holds it)."""
        return frozenset(self._handlers)

    # ---------------------------------------------------------------------------------- verbs

    async def submit(self, caller: Caller, req: SubmitRequest) -> JobReply:
        user = caller.user
        from hfai.controller.validate import check_dev_limit, check_quota

        restricted = self._setting(names.RESTRICTED_KEY, RestrictedUsers).users.get(user)
        if restricted is not None:
            raise Forbidden(f"{user} is restricted and may not submit: {restricted}")
        spec = self._validate(replace(req.spec, user=user, by_operator=caller.operator))
        quotas = quotas_of(self._setting(names.QUOTAS_KEY, QuotaTable), self._config.quota_needed_above)
        if spec.priority == AUTO_PRIORITY:
            views = [job_view(j) for j in self._jobs.values.values() if not j.state.final]
            spec = replace(spec, priority=resolve_auto(user, spec.group, spec.nodes, views, quotas))
        check_quota(spec, quotas)
        if spec.kind == JOB_DEV:
            if req.array:
                raise InvalidRequest("a development session cannot be a job array")
            live = sum(1 for j in self._jobs.values.values()
                       if j.spec.user == user and j.spec.kind == JOB_DEV and not j.state.final)
            check_dev_limit(spec, live, self._dev.max_per_user)
        if req.request_id and not req.array:
            # A copy of a submission already made (the client sent it again, through another
            # server): the job the first made, whichever replica made it. (An array's members are
            # each found or made by _create, none twice.)
            made = await self._made(user, _submitted_id(user, req.request_id))
            if made is not None:
                return JobReply(job=made)
        if not req.force:
            for j in self._jobs.values.values():
                if j.spec.user == user and j.spec.name == spec.name and not j.state.final:
                    raise Conflict(f"job {spec.name!r} is already {j.state.value} as {j.id}; "
                                   "stop it first, or submit with -f/--force to run another")
        self._check_dependencies(caller, spec)
        now = time.time()
        if not req.array:
            record = await self._create(replace(spec, array_id="", array_index=-1, array_limit=0), user, now,
                                        _submitted_id(user, req.request_id))
            self._on_submit()
            return JobReply(job=record)
        # A job array: one record per index, named NAME[i], each told its index (HFAI_ARRAY_INDEX).
        array_id = _submitted_id(user, req.request_id, "array") or uuid.uuid4().hex[:10]
        created = []
        for k, i in enumerate(check_array(req.array)):
            member = replace(spec, name=f"{spec.name}[{i}]", array_id=array_id, array_index=i,
                             env={**spec.env, "HFAI_ARRAY_INDEX": str(i), "HFAI_ARRAY_ID": array_id})
            # A microsecond apart, in index order: first come, first served then starts the members
            # in index order, where one submit time would leave the order to their random ids.
            created.append(await self._create(member, user, now + k * 1e-6, _submitted_id(user, req.request_id, i)))
        self._on_submit()
        return JobReply(job=created[0], array_ids=tuple(r.id for r in created))

    async def _made(self, user: str, job_id: str) -> JobRecord | None:
        """``user``'s job at ``job_id``, from this replica's copy or else the bucket itself (another
        replica made it, and the copy has not heard yet); None if there is none."""
        job = self._jobs.values.get(job_id)
        if job is None:
            try:
                entry = await self._kv.get(job_id)
            except nats.js.errors.KeyNotFoundError:
                return None
            job = decode(entry.value, JobRecord) if entry.value else None
        return job if job is not None and job.spec.user == user else None

    async def _create(self, spec: JobSpec, user: str, now: float, job_id: str = "") -> JobRecord:
        """A new job's record, at ``job_id`` (random if ""). A record there already (a copy of the
        same submission got there first, see SubmitRequest.request_id) is the one returned."""
        queued, submitted = reasons.queued(), reasons.submitted(by=user)
        record = JobRecord(
            id=job_id or uuid.uuid4().hex[:10], spec=spec, state=ChainState.QUEUED, submit_ts=now,
            reason=queued.text(), why=queued,
            history=(JobEvent(ts=now, state=ChainState.QUEUED, reason=submitted.text(), why=submitted),),
        )
        try:
            rev = await self._kv.create(record.id, encode(record))
        except nats.js.errors.KeyWrongLastSequenceError:
            made = await self._made(user, record.id) if job_id else None
            if made is None:
                raise
            return made
        self._jobs.put_local(record.id, record, rev)
        return record

    def _check_dependencies(self, caller: Caller, spec: JobSpec) -> None:
        """Every job named in --after exists and is the caller's (or the caller is an operator)."""
        for entry in spec.after:
            dep, _ = parse_dependency(entry)
            job = self._jobs.values.get(dep)
            if job is None:
                raise NotFound(f"--after {dep}: no such job (use a job id, see hfai ps -a)")
            if not caller.may_act_on(job):
                raise Forbidden(f"--after {dep}: job {dep} belongs to {job.spec.user}; depend on your own jobs")

    def _validate(self, spec: JobSpec) -> JobSpec:
        # Refuse at submit what the agents could not launch (pure checks in controller/validate.py).
        from hfai.controller.validate import validate_spec

        return validate_spec(spec, self._nodes.records())

    async def list(self, caller: Caller, req: ListRequest) -> Encoded:
        """A page of jobs (a ``JobList``, encoded), each encoded once (controller/paging.py)."""
        after = (req.after_ts, req.after_id)
        # Only my jobs: looked up by user, not found among everyone's (20,000 queued of others).
        candidates = self._jobs.values.values() if req.all_users else self._by_user.jobs_of(caller.user)
        jobs = [
            j for j in candidates
            if (req.include_finished or not j.state.final) and (j.submit_ts, j.id) > after
        ]
        jobs.sort(key=lambda j: (j.submit_ts, j.id))
        keep = req.history  # < 0: all of it
        trimmed = (j if keep < 0 or len(j.history) <= keep else evolve(j, history=j.history[len(j.history) - keep:])
                   for j in jobs)
        return paged_reply(JobList, "jobs", (pack(_shown_to(caller, self._waits.shown(j))) for j in trimmed),
                           self._config.api_reply_bytes)

    async def status(self, caller: Caller, req: JobRequest) -> JobReply:
        job = await self._find(caller.user, req.job, shown=True)
        # Its log watchdog as its nodes' heartbeats last said (shown, never stored).
        watch = watch_of(job, self._nodes.cache.values)
        return JobReply(job=_shown_to(caller, job if watch is None else replace(job, watchdog=watch)))

    async def stop(self, caller: Caller, req: StopRequest) -> JobReply:
        job = await self._find(caller.user, req.job)
        if not caller.may_act_on(job):
            raise Forbidden(f"job {job.id} belongs to {job.spec.user}; you can only stop your own jobs")
        by = caller.user if job.spec.user == caller.user else f"operator {caller.user}"
        record, rev, changed = await cas_update(self._kv, job.id, lambda j: apply_stop(j, time.time(), by))
        if changed:
            self._jobs.put_local(record.id, record, rev)
            self._on_submit()
        return JobReply(job=record)

    async def _change(self, caller: Caller, ref: str, verb: str, change) -> JobReply:
        """Apply ``change`` (record -> record; raises for a job in the wrong state) to the caller's
        job, or any job for an operator, with compare-and-set."""
        job = await self._find(caller.user, ref)
        if not caller.may_act_on(job):
            raise Forbidden(f"job {job.id} belongs to {job.spec.user}; you can only {verb} your own jobs")
        record, rev, changed = await cas_update(self._kv, job.id, change)
        if changed:
            self._jobs.put_local(record.id, record, rev)
            self._on_submit()
        return JobReply(job=_shown_to(caller, record))

    def _by(self, caller: Caller, job: JobRecord) -> str:
        return caller.user if job.spec.user == caller.user else f"operator {caller.user}"

    async def hold(self, caller: Caller, req: HoldRequest) -> JobReply:
        return await self._change(caller, req.job, "hold" if req.hold else "release",
                                  lambda j: transitions.apply_hold(j, self._by(caller, j), req.hold))

    async def requeue(self, caller: Caller, req: RequeueRequest) -> JobReply:
        return await self._change(caller, req.job, "requeue",
                                  lambda j: transitions.apply_requeue(j, time.time(), self._by(caller, j)))

    async def update(self, caller: Caller, req: UpdateRequest) -> JobReply:
        if req.priority is None and req.nodes is None:
            raise InvalidRequest("nothing to change: give a priority and/or a node count")
        from hfai.controller.validate import check_quota

        job = await self._find(caller.user, req.job)
        spec = job.spec
        if req.priority is not None:
            spec = replace(spec, priority=req.priority)
        if req.nodes is not None:
            spec = replace(spec, nodes=req.nodes)
        # The changed spec must pass what a submitted one would (sizes, group, quota).
        spec = self._validate(spec)
        check_quota(spec, quotas_of(self._setting(names.QUOTAS_KEY, QuotaTable), self._config.quota_needed_above))
        return await self._change(caller, req.job, "change",
                                  lambda j: transitions.apply_update(j, req.priority, req.nodes))

    async def estimate(self, caller: Caller, req: EstimateRequest) -> EstimateReply:
        """Start estimates of every waiting job (public, like the queue): a forward replay of the
        plan on this replica's records and nodes, run in a thread (a long queue takes a moment)."""
        import asyncio

        from hfai.controller.estimate import estimate_starts, guess_from_history
        from hfai.controller.inputs import plan_nodes, plan_settings

        if not 0 <= req.default_run_s <= MAX_ASSUMED_RUN_S:
            raise InvalidRequest(f"the assumed run time must be 0 (none) to {MAX_ASSUMED_RUN_S:g} s, "
                                 f"not {req.default_run_s}")
        records = list(self._jobs.values.values())
        # Forgotten nodes count at once here: the estimate must not place work on them.
        nodes = plan_nodes(self._nodes, records, float("inf"))
        settings = plan_settings(self._config, self._settings.values if self._settings is not None else {}, False)
        now = time.time()
        guess = guess_from_history(records) if req.guess and not req.default_run_s else None
        starts = await asyncio.to_thread(estimate_starts, records, nodes, settings, now,
                                         default_run_s=req.default_run_s or None, guess=guess)
        return EstimateReply(starts=starts, now=now, guessed_run_s=guess.typical_run_s if guess else 0.0)

    async def logs(self, caller: Caller, req: LogRequest) -> LogChunk:
        """A slice of one rank's log, relayed from the agent of the node that rank ran on; only the
        job's owner and operators may read it (agents answer only the controllers)."""
        job = await self._find(caller.user, req.job_id)
        if not caller.may_act_on(job):
            raise Forbidden(f"job {job.id} belongs to {job.spec.user}; you can only read your own jobs' logs")
        nodes = job.nodes or job.last_nodes
        if not nodes:
            return LogChunk(data=b"", offset=req.offset, size=0, exists=False)
        if not 0 <= req.rank < len(nodes):
            raise InvalidRequest(f"job {job.id} has ranks 0..{len(nodes) - 1}, not {req.rank}")
        if self._request is None:
            raise Unavailable("this controller cannot reach the agents' log service")
        ask = LogRequest(job_id=job.id, rank=req.rank, offset=max(0, req.offset),
                         max_bytes=max(1, min(req.max_bytes, MAX_LOG_CHUNK)), timestamps=req.timestamps)
        try:
            data = await self._request(names.agent_logs_subject(nodes[req.rank]), encode(ask),
                                       self._config.log_request_timeout_s)
        except (TimeoutError, nats.errors.NoRespondersError, nats.errors.TimeoutError):
            raise Unavailable(f"the agent of node {nodes[req.rank]} did not answer for the log") from None
        reply = decode(data, (LogChunk, ErrorReply))
        if isinstance(reply, ErrorReply):
            raise error_of(reply.code, reply.message, reply.sub)
        return reply

    async def nodes(self, caller: Caller, req: NodesRequest) -> Encoded:
        """A page of nodes (a ``NodesReply``, encoded): each heartbeat record is encoded once
        (controller/node_pages.py)."""
        store = self.store_health() if self.store_health is not None else None
        return self._node_pages.page(req.after, self._jobs.values.values(), self._config.api_reply_bytes, store)

    async def usage_report(self, caller: Caller, req: UsageRequest) -> UsageReply:
        """GPU-hours per day, user, group and priority: public, like the queue."""
        if self.usage is None:
            raise Unavailable("this controller keeps no usage accounts")
        return self.usage(req, self._config.api_reply_bytes)

    # ------------------------------------------------------------------------ operator verbs

    def _setting(self, key: str, kind: type):
        value = self._settings.values.get(key) if self._settings is not None else None
        return value if isinstance(value, kind) else kind()

    @staticmethod
    def _require_operator(caller: Caller) -> None:
        if not caller.operator:
            raise Forbidden(f"{caller.user} is not an operator; only operators may change quotas or drain nodes")

    async def _update_setting(self, key: str, kind: type, change) -> None:
        """Compare-and-set one settings key (created on first use)."""
        if self._settings_kv is None or self._settings is None:
            raise Unavailable("this controller serves no settings (quotas, drained nodes)")
        new, rev, changed = await cas_value(self._settings_kv, key, kind, change, what="setting", missing=kind,
                                            lost_race=(nats.js.errors.APIError,))
        if changed:
            self._settings.put_local(key, new, rev)

    async def quota_set(self, caller: Caller, req: QuotaSetRequest) -> SettingsReply:
        self._require_operator(caller)
        e = req.entry
        for what, value in (("user", e.user), ("group", e.group)):
            if value != "*":
                names.check_token(what, value)
        if e.priority not in {p.value for p in Priority}:
            raise InvalidRequest(f"unknown priority {e.priority}")
        if e.nodes > MAX_NODES:
            raise InvalidRequest(f"a quota is at most {MAX_NODES} nodes, not {e.nodes}")

        def change(table: QuotaTable) -> QuotaTable:
            kept = [q for q in table.entries if (q.user, q.priority, q.group) != (e.user, e.priority, e.group)]
            return QuotaTable(entries=tuple(kept + ([e] if e.nodes >= 0 else [])))

        await self._update_setting(names.QUOTAS_KEY, QuotaTable, change)
        self._on_submit()
        return await self.settings(caller, QuotasRequest())

    async def settings(self, caller: Caller, req: QuotasRequest) -> SettingsReply:
        return SettingsReply(quotas=self._setting(names.QUOTAS_KEY, QuotaTable),
                             drained=self._setting(names.DRAINED_KEY, DrainedNodes),
                             quota_needed_above=self._config.quota_needed_above)

    async def drain(self, caller: Caller, req: DrainRequest) -> SettingsReply:
        self._require_operator(caller)
        if req.node not in {r.name for r in self._nodes.records()}:
            raise NotFound(f"no node {req.node!r}")

        def change(d: DrainedNodes) -> DrainedNodes:
            nodes = {k: v for k, v in d.nodes.items() if k != req.node}
            if req.drain:
                nodes[req.node] = req.reason or f"drained by {caller.user}"
            return DrainedNodes(nodes=nodes)

        await self._update_setting(names.DRAINED_KEY, DrainedNodes, change)
        self._on_submit()
        return await self.settings(caller, QuotasRequest())

    async def _find(self, user: str, ref: str, shown: bool = False) -> JobRecord:
        """A job by id, else by name (see :func:`pick_named`); ``shown``: with the reason it
        waits for, if the leader noted one (controller/waits.py)."""
        if not ref:
            raise InvalidRequest("name a job by id or name")
        try:
            if names.is_token(ref):
                entry = await self._kv.get(ref)
                job = decode(entry.value, JobRecord)
                return self._waits.shown(job, entry.revision or 0) if shown else job
        except nats.js.errors.KeyNotFoundError:
            pass  # no job has that id: it may be a name
        job = pick_named([j for j in self._jobs.values.values() if j.spec.name == ref], user, ref)
        return self._waits.shown(job) if shown else job


class _ByUser:
    """Each user's job ids, kept up with the jobs copy's changes (O(changes) a call): a user's
    own list is found without looking at everyone's records."""

    def __init__(self, jobs: KVCache[JobRecord]):
        self._jobs = jobs
        self._changed: set[str] | None = None
        self._ids: dict[str, set[str]] = {}
        self._user: dict[str, str] = {}  # job id -> its user

    def jobs_of(self, user: str) -> list[JobRecord]:
        values = self._jobs.values
        if self._changed is None:
            self._changed = self._jobs.track()
            keys: list[str] = list(values)
        else:
            keys = list(self._changed)
            self._changed.clear()
        for key in keys:
            job = values.get(key)
            was = self._user.get(key)
            if job is not None and job.spec.user == was:
                continue
            if was is not None:
                self._ids[was].discard(key)
                del self._user[key]
            if job is not None:
                self._ids.setdefault(job.spec.user, set()).add(key)
                self._user[key] = job.spec.user
        return [values[k] for k in self._ids.get(user, ()) if k in values]


def pick_named(named: list[JobRecord], user: str, ref: str) -> JobRecord:
    """Which of the jobs called ``ref`` a command means (pure). The caller's own jobs first, else
    anyone's; of those, the one active job, since with -f a finished namesake is common and
    stopping it instead would leave the running one running; with no active job the newest. Two
    or more active ones are ambiguous: refused, listing their ids, never a guess."""
    if not named:
        raise NotFound(f"no job with id or name {ref!r}")
    mine = [j for j in named if j.spec.user == user] or named
    active = sorted((j for j in mine if not j.state.final), key=lambda j: (j.submit_ts, j.id))
    if len(active) > 1:
        shown = ", ".join(f"{j.id} ({j.state.value})" for j in active[:10]) + (", …" if len(active) > 10 else "")
        raise InvalidRequest(f"{len(active)} active jobs are named {ref!r}: {shown}; name one by its id")
    return active[0] if active else max(mine, key=lambda j: (j.submit_ts, j.id))


def _shown_to(caller: Caller, job: JobRecord) -> JobRecord:
    """The record as ``caller`` may see it: everyone sees the queue, but the values of another
    user's environment variables (often tokens) only its owner and operators."""
    if caller.may_act_on(job) or not job.spec.env:
        return job
    return replace(job, spec=replace(job.spec, env={k: "<hidden>" for k in job.spec.env}))
