"""Is the NATS server a daemon is connected to cut off from its cluster? If so, go to another.

A server that lost its routes (a partition) keeps its clients: their connection stays up and their
pings are answered, yet every JetStream request waits for a leader on the far side. nats-py
reconnects only when the connection itself fails, so a daemon would stay with that server for as
long as the partition lasts (its heartbeats failing, its requests hanging). Each daemon's
connection is therefore checked: every ``[nats] cutoff_check_s`` it asks for a replicated
stream's info (the nodes bucket's), given ``cutoff_timeout_s``. The stream's leader answers, and
counts only if it heard from a quorum of its replicas within ``cutoff_silent_s``: a leader on the
cut-off server itself answers from its own copy until it steps down. A client whose role may not
ask about that stream (the web) asks for the account's info, which the meta leader answers. When
nothing has been answered for ``cutoff_after_s``, the connection is moved
(``Client.force_reconnect``) to another server, and the one it left is tried last for
``cutoff_avoid_s``.

The decisions are pure (:class:`CutoffWatch`, :class:`ServerChooser`, :func:`quorum_failure`);
:class:`ClusterWatch` is the task that acts on them, one per daemon connection, started and
stopped by ``hfai.core.nats.connect``. The store probe (hfai.controller.store_health) asks
:func:`check` too: a write that failed while the cluster answers nothing is a server cut off (or
down), not a store that refuses writes.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nats.aio.client import Client, Server
    from nats.js import JetStreamContext

log = logging.getLogger(__name__)

#: "JetStream system temporarily unavailable": the answer of a server without a meta leader.
_NO_META_LEADER = 10008


def unanswered(e: BaseException) -> bool:
    """Whether ``e``, from a JetStream request, means the cluster behind the server did not answer
    (no answer at all, no responder, or a server without a meta leader), rather than an answer
    that refuses (which a server that still talks to its cluster gives)."""
    import nats.js.errors

    if isinstance(e, (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError,
                      nats.errors.ConnectionClosedError, nats.js.errors.ServiceUnavailableError)):
        return True
    return isinstance(e, nats.js.errors.APIError) and e.err_code == _NO_META_LEADER


def may_publish(subject: str, allowed: Sequence[str]) -> bool:
    """Whether a client allowed to publish to the patterns ``allowed`` (NATS wildcards ``*`` and
    ``>``) may publish to ``subject``."""
    tokens = subject.split(".")
    for pattern in allowed:
        want = pattern.split(".")
        for i, w in enumerate(want):
            if w == ">":
                if len(tokens) > i:
                    return True
                break
            if i >= len(tokens) or (w != "*" and w != tokens[i]):
                break
        else:
            if len(want) == len(tokens):
                return True
    return False


def quorum_failure(info: Any, silent_s: float) -> str:
    """"" if the leader that answered ``info`` (a stream's info) heard from a majority of its
    replicas within ``silent_s``, else why not. A leader on a server cut off from its cluster still
    answers reads, from its own copy, until it steps down (about 10 s later): its replicas' silence
    is what gives it away. A stream without replicas says nothing."""
    cluster = getattr(info, "cluster", None)
    peers = getattr(cluster, "replicas", None) or []
    if cluster is None or not peers:
        return ""
    if not cluster.leader:  # answered by a replica that lost its leader (and cannot elect one)
        return f"{info.config.name} has no leader"
    # ``active``: nanoseconds since the leader last heard from that replica (nats-py passes it on
    # raw); 0 is "never".
    heard = 1 + sum(1 for p in peers if not p.offline and p.active and p.active / 1e9 < silent_s)
    size = len(peers) + 1
    if 2 * heard > size:
        return ""
    return (f"the leader of {info.config.name} ({cluster.leader}) heard from {heard - 1} of its {size - 1} replicas "
            f"within {silent_s:g}s")


async def check(js: JetStreamContext, timeout_s: float, stream: str | None = None, silent_s: float = 3.0) -> str:
    """One question to the server's JetStream: "" if its cluster answered within ``timeout_s``,
    else what failed. With ``stream`` (a replicated stream the client may ask about), the stream's
    info, whose leader must also hear from a quorum of replicas (:func:`quorum_failure`); without
    it, or before the stream exists, the account's info. An answer that is an error (JetStream off
    for the account, say) is an answer."""
    import nats.js.errors

    try:
        if stream:
            try:
                return quorum_failure(await asyncio.wait_for(js.stream_info(stream), timeout_s), silent_s)
            except nats.js.errors.NotFoundError:
                pass  # not made yet: ask the account
        await asyncio.wait_for(js.account_info(), timeout_s)
        return ""
    except (TimeoutError, nats.errors.Error) as e:
        if unanswered(e):
            return f"no JetStream answer within {timeout_s:g}s ({type(e).__name__}{': ' + str(e) if str(e) else ''})"
        if isinstance(e, nats.js.errors.APIError):
            return ""
        raise


class Verdict(enum.Enum):
    """What the checks say of the server: ANSWERS; DOUBT (checks fail, for less than the time
    that decides); CUT_OFF (none answered for ``after_s``: leave it)."""

    ANSWERS = "answers"
    DOUBT = "doubt"
    CUT_OFF = "cut_off"


@dataclass
class CutoffWatch:
    """Pure: the server's verdict from the checks' outcomes, on a monotonic clock.

    CUT_OFF once no check was answered for ``after_s`` since the first unanswered one and at least
    ``min_failures`` were unanswered (one slow answer is no partition); back to ANSWERS at the first
    answer. :meth:`reset` forgets the run (a new connection is judged afresh)."""

    after_s: float
    min_failures: int = 2
    failing_since: float | None = None
    failures: int = 0

    def observe(self, answered: bool, now: float) -> Verdict:
        if answered:
            self.reset()
            return Verdict.ANSWERS
        if self.failing_since is None:
            self.failing_since = now
        self.failures += 1
        if self.failures >= self.min_failures and now - self.failing_since >= self.after_s:
            return Verdict.CUT_OFF
        return Verdict.DOUBT

    def reset(self) -> None:
        self.failing_since, self.failures = None, 0


@dataclass
class ServerChooser:
    """Pure: the server a reconnect tries next (nats-py's ``reconnect_to_server_handler``).

    A server left as cut off is tried last for ``avoid_s``; then the ones that failed least since
    the last connection, among those a server the client was configured with before one it only
    heard of from the cluster (a cut-off server is still gossiped about: a client given the others
    must not move into it), and at random among equals (a fleet must not move in lockstep). The first try
    after a lost connection goes at once; each one after it waits ``wait()`` (the caller's
    jittered backoff)."""

    avoid_s: float
    wait: Callable[[], float]
    clock: Callable[[], float] = time.monotonic
    rng: random.Random = field(default_factory=random.Random)
    avoided: dict[str, float] = field(default_factory=dict)  # netloc -> until (clock)
    tries: int = 0

    def avoid(self, netloc: str) -> None:
        self.avoided[netloc] = self.clock() + self.avoid_s

    def connected(self) -> None:
        self.tries = 0

    def __call__(self, servers: Sequence[Server], info: dict[str, Any]) -> tuple[Server | None, float]:
        if not servers:
            return None, 0.0
        now = self.clock()
        self.avoided = {k: until for k, until in self.avoided.items() if until > now}
        pick = min(servers, key=lambda s: (s.uri.netloc in self.avoided, s.reconnects,
                                           bool(getattr(s, "discovered", False)), self.rng.random()))
        delay = self.wait() if self.tries else 0.0
        self.tries += 1
        return pick, delay


@dataclass(frozen=True)
class CutoffSettings:
    """``[nats] cutoff_*`` (hfai.core.config): ``check_s`` 0 turns the checks off. ``stream``: the
    replicated stream whose info the checks ask (None: the account's info only)."""

    check_s: float
    timeout_s: float
    after_s: float
    avoid_s: float
    silent_s: float
    stream: str | None = None


class ClusterWatch:
    """Checks one connection's server until stopped, and moves the connection when it is cut off.

    With one server to go to there is nowhere else: the verdict is logged, the connection kept."""

    def __init__(self, settings: CutoffSettings, chooser: ServerChooser):
        self.settings, self.chooser = settings, chooser
        self.watch = CutoffWatch(settings.after_s)
        self.moves = 0  # connections moved away from a cut-off server (tests and logs read it)
        self._task: asyncio.Task | None = None

    def start(self, nc: Client) -> None:
        if self.settings.check_s > 0 and self._task is None:
            self._task = asyncio.ensure_future(self._run(nc))

    async def stop(self) -> None:
        """Cancel the checks and wait for them; safe to call twice."""
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self, nc: Client) -> None:
        s = self.settings
        js = nc.jetstream(timeout=s.timeout_s)
        while not nc.is_closed:
            if not nc.is_connected:
                self.watch.reset()  # reconnecting: the next server is judged afresh
            else:
                try:
                    failure = await check(js, s.timeout_s, s.stream, s.silent_s)
                    if self.watch.observe(not failure, time.monotonic()) is Verdict.CUT_OFF:
                        await self._leave(nc, failure)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a check must never end the checks; the next one tells
                    log.exception("NATS cluster check crashed")
            await asyncio.sleep(s.check_s)

    async def _leave(self, nc: Client, failure: str) -> None:
        url = nc.connected_url
        here = url.netloc if url is not None else "?"
        others = {u.netloc for u in nc.servers} - {here}
        waited = time.monotonic() - (self.watch.failing_since or time.monotonic())
        if not others:
            log.warning("the NATS server %s gave no JetStream answer for %.1fs (%s) and there is no other "
                        "server to go to: staying", here, waited, failure)
            self.watch.reset()
            return
        log.warning("the NATS server %s gave no JetStream answer for %.1fs (%s): cut off from its cluster? "
                    "reconnecting to another of %s", here, waited, failure, ", ".join(sorted(others)))
        self.chooser.avoid(here)
        self.watch.reset()
        self.moves += 1
        await nc.force_reconnect()
