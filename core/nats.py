"""NATS plumbing shared by the controller, the agent and the CLI (never imported by jobs).

Connecting, making sure the JetStream buckets and the events stream exist, and following a KV
watch through failures (:func:`follow`). Creation is idempotent and any component may do it first:
a fresh cluster needs no setup step. The JetStream client (``nats.js``) is imported where it is
used: a CLI call that only asks the controller does without it (``hfai.api._light_nats``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn

import nats
import nats.errors
from nats.aio.client import Client

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.kv import KeyValue

from hfai.auth import jwt, nkey, roles
from hfai.core.config import Config
from hfai.core.retry import Backoff
from hfai.protocol import names
from hfai.protocol._lazy import frozen_dataclass
from hfai.protocol.errors import ErrorSub, Forbidden, InvalidRequest, Unavailable

log = logging.getLogger(__name__)

EVENTS_MAX_AGE_S = 7 * 24 * 3600


#: How often a daemon waiting for NATS to come up says so in its log.
WAIT_LOG_INTERVAL_S = 30.0
#: The wait before connecting again to a server just tried: jittered, doubling from the first to
#: the second while the server stays away (a fleet that lost its server must not come back in
#: lockstep), short again after a reconnect.
RECONNECT_WAIT_S, RECONNECT_WAIT_CAP_S = 0.5, 2.0
#: The longest wait between two tries of setting up (or finding) the buckets; the first is
#: ``[nats] setup_retry_s``.
SETUP_RETRY_CAP_S = 10.0


class Credentials:
    """A credentials file read once: the JWT and seed a connection presents, and the claims the
    client reads from that JWT (its name, its permissions). A CLI call reads its file this once:
    :func:`connect` gives nats-py the JWT and a signature of the server's nonce from here (nats-py
    itself would read the file twice more, and sign with ``nkeys``: see :mod:`hfai.auth.nkey`)."""

    __slots__ = ("path", "jwt", "claims", "_seed")

    def __init__(self, path: str, text: str) -> None:
        token, seed = jwt.parse_creds(text)
        try:
            nkey.decode_seed(seed)
        except InvalidRequest as e:
            raise Forbidden(f"the credentials file {path} holds no usable user seed ({e})") from None
        self.path, self.jwt, self._seed = path, token, seed
        self.claims = jwt.claims(token)

    @property
    def inbox_prefix(self) -> str:
        """The inbox prefix the JWT's permissions let this client subscribe to."""
        return roles.from_claims(self.claims["nats"]).inbox_prefix

    def user_jwt(self) -> bytes:
        return self.jwt.encode()

    def sign_nonce(self, nonce: str) -> bytes:
        """The server's nonce signed with the seed, as nats-py sends it (base64)."""
        import base64

        return base64.b64encode(nkey.sign(self._seed, nonce.encode()))


def read_credentials(creds: str | os.PathLike) -> Credentials:
    """The credentials file ``creds``, read and parsed (Forbidden where it is missing or unreadable;
    InvalidRequest where it is no credentials file)."""
    try:
        with open(creds) as f:
            text = f.read()
    except FileNotFoundError:
        raise Forbidden(f"no NATS credentials at {creds}; an operator issues them with "
                        "`hfai admin user add NAME` (a local cluster makes yours at `hfai local up`)") from None
    except PermissionError:
        raise Forbidden(f"cannot read the NATS credentials file {creds} (it is not yours?)") from None
    return Credentials(str(creds), text)


def _identity(creds: str | Credentials) -> dict:
    """Options that present the credentials ``creds`` and use the inbox its permissions allow: a
    file (a daemon's: nats-py reads it again at each reconnect, so a replaced file is presented
    then), or credentials read already (a client that never reconnects: signed here, from them)."""
    if isinstance(creds, Credentials):
        return {"user_jwt_cb": creds.user_jwt, "signature_cb": creds.sign_nonce, "inbox_prefix": creds.inbox_prefix}
    return {"user_credentials": creds, "inbox_prefix": read_credentials(creds).inbox_prefix}


def _check_stream(creds: str | Credentials) -> str | None:
    """The stream whose info a daemon's cluster checks ask (hfai.core.cutoff): the nodes bucket's, which
    every daemon's role but the web's may ask about (the web's checks ask for the account's info)."""
    from hfai.core import cutoff as _cutoff

    stream = f"KV_{names.BUCKET_NODES}"
    if not creds:
        return stream
    try:
        allowed = roles.from_claims(_credentials(creds).claims["nats"]).pub
    except (Forbidden, InvalidRequest, KeyError):
        return None  # connecting says what is wrong with them
    return stream if _cutoff.may_publish(f"$JS.API.STREAM.INFO.{stream}", allowed) else None


def _credentials(creds: str | Credentials) -> Credentials:
    return creds if isinstance(creds, Credentials) else read_credentials(creds)


def tls_options(config: Config) -> dict:
    if not config.nats.tls_ca:
        return {}
    import ssl

    return {"tls": ssl.create_default_context(cafile=config.nats.tls_ca)}


def _websocket_transport() -> None:
    """Give nats-py its WebSocket transport back if the client imported it without aiohttp
    (``hfai.api._light_nats``)."""
    import nats.aio.transport as transport

    if transport.aiohttp is None:
        import aiohttp
        import multidict

        transport.aiohttp, transport.multidict = aiohttp, multidict


def read_in(n: int) -> bool:
    """Have nats-py read its sockets ``n`` bytes at a time in this process, for connections made
    from now on. nats-py 2.x has no option for it: its module constant ``DEFAULT_BUFFER_SIZE``
    (32 KiB), which it reads at each connect (its stream reader's limit) and each read, is set.
    For a process whose connection carries large messages (the storage service's 4 MiB puts: 128
    reads, parser calls and copies into the parser's growing buffer each, most of its event
    loop's time, docs/storage.md). The one place that sets another package's constant: a nats-py
    without it is said in the log (False: reads stay nats-py's own), and
    tests/test_storage_push.py fails where nats-py no longer reads with it."""
    import nats.aio.client

    if not isinstance(getattr(nats.aio.client, "DEFAULT_BUFFER_SIZE", None), int):
        log.warning("this nats-py (%s) has no DEFAULT_BUFFER_SIZE: its connections read as it chooses, not %d "
                    "bytes at a time", getattr(nats.aio.client, "__version__", "?"), n)
        return False
    nats.aio.client.DEFAULT_BUFFER_SIZE = n
    return True


async def connect(config: Config, name: str, reconnect: bool = True, creds: str | Credentials | None = None,
                  on_error: Callable[[Exception], Awaitable[None]] | None = None) -> Client:
    """Connect to NATS or raise Unavailable with the URL in the message.

    ``creds`` (default ``config.nats.creds``) is the credentials file that proves who connects,
    or those credentials read already (:func:`read_credentials`); a server that refuses them
    gives :class:`Forbidden`.

    ``reconnect=False`` (the CLI) gives up after ``connect_timeout_s`` per server. nats-py alone
    would not: a refused first connection leaves its connect pending forever, with or without
    reconnects, so the bound is enforced here. ``reconnect=True`` (the daemons) waits for the
    servers to come up, logging every ``WAIT_LOG_INTERVAL_S`` while it waits, and checks for as
    long as it is open that its server still answers for its cluster, moving to another server
    when it does not (hfai.core.cutoff; the checks stop when the connection closes).
    """
    from hfai.core import cutoff as _cutoff

    nc = Client()
    reconnect_wait = Backoff(RECONNECT_WAIT_S, RECONNECT_WAIT_CAP_S)
    creds = creds if creds is not None else config.nats.creds
    n = config.nats
    chooser = _cutoff.ServerChooser(avoid_s=n.cutoff_avoid_s, wait=reconnect_wait.next)
    cluster = _cutoff.ClusterWatch(_cutoff.CutoffSettings(
        check_s=n.cutoff_check_s if reconnect else 0.0, timeout_s=n.cutoff_timeout_s, after_s=n.cutoff_after_s,
        avoid_s=n.cutoff_avoid_s, silent_s=n.cutoff_silent_s, stream=_check_stream(creds) if reconnect else None),
        chooser)

    async def log_error(e: Exception) -> None:
        log.debug("nats error: %s", e)
        if not nc.is_connected:
            # A connection attempt failed. nats-py reads this option before each attempt at a
            # server it tried a moment ago (first connection and reconnects alike).
            nc.options["reconnect_time_wait"] = reconnect_wait.next()
        if on_error is not None:
            await on_error(e)

    async def reconnected() -> None:
        reconnect_wait.reset()
        chooser.connected()
        nc.options["reconnect_time_wait"] = reconnect_wait.next()
        await _on_reconnected()

    async def closed() -> None:
        await cluster.stop()

    servers = [u.strip() for u in config.nats.url.split(",") if u.strip()]  # a cluster: a list
    if any(u.startswith(("ws://", "wss://")) for u in servers):
        _websocket_transport()
    identity = _identity(creds) if creds else {}
    creds_file = creds.path if isinstance(creds, Credentials) else creds
    # Our own Client rather than nats.connect(): a refused first connection (allow_reconnect off)
    # leaves its socket open, in CLOSE-WAIT until garbage collection, unless it is closed here.
    options: dict[str, Any] = dict(  # Client.connect's annotations say int where floats work
        name=name,
        connect_timeout=config.nats.connect_timeout_s,
        allow_reconnect=reconnect,
        max_reconnect_attempts=-1 if reconnect else 0,
        reconnect_time_wait=reconnect_wait.next(),
        error_cb=log_error,
        reconnected_cb=reconnected,
        closed_cb=closed,
        # Reconnects go where the chooser says: away from a server left as cut off, and with the
        # same backoff as the first connection's tries.
        reconnect_to_server_handler=chooser,
        **identity,
        **tls_options(config),
    )
    attempt = asyncio.ensure_future(nc.connect(servers, **options))
    try:
        if not reconnect:
            limit = config.nats.connect_timeout_s * max(1, len(servers)) + 1.0
            await asyncio.wait_for(attempt, timeout=limit)
            return nc
        while True:
            done, _ = await asyncio.wait({attempt}, timeout=WAIT_LOG_INTERVAL_S)
            if done:
                await attempt
                cluster.start(nc)
                return nc
            log.warning("still waiting for NATS at %s", config.nats.url)
    except (TimeoutError, OSError, nats.errors.NoServersError, nats.errors.Error) as e:
        if server_refusal(e) is ErrorSub.CREDENTIALS_REFUSED:
            raise Forbidden(f"NATS at {config.nats.url} refused " + (
                f"the credentials in {creds_file} (revoked, or issued for another cluster)" if creds else
                "a connection without credentials; an operator issues them with `hfai admin user add NAME`"
            ), sub=ErrorSub.CREDENTIALS_REFUSED) from None
        why = "no answer" if isinstance(e, asyncio.TimeoutError) else e.__class__.__name__
        raise Unavailable(
            f"cannot reach NATS at {config.nats.url} ({why}); is the cluster up? "
            "(`hfai local up` starts a local one)"
        ) from e
    finally:
        if not attempt.done():  # cancelled while waiting for NATS: our own task ends with us
            # hfai.core.daemon (and argparse with it) is the daemons' and the watches': a CLI call that
            # connects does without it.
            from hfai.core.daemon import CANCEL_TIMEOUT_S, cancel_and_wait

            await cancel_and_wait([attempt], CANCEL_TIMEOUT_S)
        if not nc.is_connected:
            await nc.close()


@frozen_dataclass  # made at first use (hfai.protocol._lazy): a CLI call never asks for the buckets
class Buckets:
    leader: KeyValue
    jobs: KeyValue
    nodes: KeyValue
    assign: KeyValue
    users: KeyValue


async def _bucket(js: JetStreamContext, name: str, replicas: int, ttl: float | None = None) -> KeyValue:
    import nats.js.errors

    try:
        return await js.key_value(name)
    except nats.js.errors.BucketNotFoundError:
        pass  # made next
    try:
        return await js.create_key_value(bucket=name, history=1, ttl=ttl, replicas=replicas)
    except nats.js.errors.APIError as create_error:
        # Lost a creation race with another component: the bucket exists now. If it does not, the
        # creation's own error is the one that explains why (e.g. too few peers for replicas).
        try:
            return await js.key_value(name)
        except nats.js.errors.APIError:
            raise create_error from None


async def _open(js: JetStreamContext, bucket: str) -> KeyValue:
    """A bucket that must exist; a missing one is transient (a controller creates it)."""
    import nats.js.errors

    try:
        return await js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        raise nats.js.errors.ServiceUnavailableError(description=f"bucket {bucket} not created yet") from None


async def ensure_buckets(js: JetStreamContext, config: Config) -> Buckets:
    r = config.nats.replicas
    return Buckets(
        # The lease expires through the bucket TTL: a plain update keeps it (see docs/architecture.md).
        leader=await _bucket(js, names.BUCKET_LEADER, r, ttl=config.controller.lease_ttl_s),
        jobs=await _bucket(js, names.BUCKET_JOBS, r),
        nodes=await _bucket(js, names.BUCKET_NODES, r),
        assign=await _bucket(js, names.BUCKET_ASSIGN, r),
        users=await _bucket(js, names.BUCKET_USERS, r),
    )


async def ensure_events_stream(js: JetStreamContext, config: Config) -> None:
    import nats.js.errors
    from nats.js.api import StreamConfig

    cfg = StreamConfig(
        name=names.EVENTS_STREAM,
        subjects=[names.EVENTS_WILDCARD],
        max_age=EVENTS_MAX_AGE_S,
        num_replicas=config.nats.replicas,
        duplicate_window=120.0,
    )
    try:
        await js.stream_info(names.EVENTS_STREAM)
    except nats.js.errors.NotFoundError:
        try:
            await js.add_stream(cfg)
        except nats.js.errors.APIError as create_error:
            try:  # created by another component meanwhile?
                await js.stream_info(names.EVENTS_STREAM)
            except nats.js.errors.APIError:
                raise create_error from None


#: JetStream errors that pass by themselves: no answer while the cluster elects its meta leader,
#: "temporarily unavailable" (503, 10008), too few peers up to place a replicated bucket (10005).
#: Not 500 as such: "replicas > 1 not supported in non-clustered mode" (10074) is a 500 that
#: retrying never cures.
_TRANSIENT_ERR_CODES = {10005, 10008}


def is_transient(e: BaseException) -> bool:
    import nats.js.errors

    if isinstance(e, (nats.errors.TimeoutError, asyncio.TimeoutError, nats.js.errors.ServiceUnavailableError)):
        return True
    return isinstance(e, nats.js.errors.APIError) and e.err_code in _TRANSIENT_ERR_CODES


#: Pause before watching a KV key or bucket again after its watch failed or ended: jittered,
#: doubling up to the cap while the watches deliver nothing.
REWATCH_S, REWATCH_CAP_S = 0.5, 5.0
#: What a watch may fail with and watching anew may cure: NATS away, a server or stream leader lost.
WATCH_ERRORS = (nats.errors.Error, asyncio.TimeoutError)


# Watches to renew after a reconnect. A KV watch is an ephemeral consumer on the server: after a
# server restart it is gone, yet nats-py reports nothing until two idle heartbeats are missed
# (10-20 s), during which agents would miss assignments and the leader heartbeats.
_RECONNECT_WAITERS: set[asyncio.Event] = set()


async def _on_reconnected() -> None:
    log.info("reconnected to NATS; renewing watches")
    for event in list(_RECONNECT_WAITERS):
        event.set()


class _Reconnected(Exception):
    """The connection came back: the watch may be dead without saying so."""


async def _next(it: Any, reconnected: asyncio.Event) -> Any:
    """The watch's next entry, or :class:`_Reconnected` if a reconnect happens first."""
    from hfai.core.daemon import abandon, raise_if_cancelled

    nxt = asyncio.ensure_future(it.__anext__())
    if not nxt.done():
        again = asyncio.ensure_future(reconnected.wait())
        try:
            await asyncio.wait({nxt, again}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            again.cancel()
            await asyncio.gather(again, return_exceptions=True)
            if not nxt.done():
                # Waits inside nats-py, which may hold on to a cancellation: not awaited here, it
                # ends with the watch the caller stops next (its outcome is retrieved, and dropped).
                abandon(nxt)
    if not nxt.done() or nxt.cancelled():
        raise_if_cancelled()
        raise _Reconnected()
    return nxt.result()


async def follow(open_watch: Callable[[], Awaitable[Any]], on_entry: Callable[[Any], None], what: str,
                 on_watch: Callable[[], None] | None = None, watcher: Any = None,
                 retry_s: float = REWATCH_S) -> NoReturn:
    """Apply a KV watch's entries to ``on_entry`` until cancelled (None: the watch has delivered
    everything that existed when it began), watching anew whenever the watch fails or ends (a
    NATS server or stream leader lost): a new watch delivers the current values first.

    ``open_watch`` opens one (``kv.watch(key)``, ``kv.watchall()``); ``watcher``, if given, is
    one already open, used first. ``on_watch`` runs before each watch delivers anything (what the
    caller tracks of one snapshot starts anew). NATS errors (:data:`WATCH_ERRORS`) are retried
    after a jittered wait, ``retry_s`` at first and doubling up to :data:`REWATCH_CAP_S` until a
    watch delivers again; errors of ``on_entry`` end the task: a fault of our own is no reason to
    watch again, and its daemon's :class:`hfai.core.daemon.Supervisor` stops the process."""
    reconnected = asyncio.Event()
    _RECONNECT_WAITERS.add(reconnected)
    try:
        await _follow(open_watch, on_entry, what, on_watch, watcher, retry_s, reconnected)
    finally:
        _RECONNECT_WAITERS.discard(reconnected)


async def _follow(open_watch: Callable[[], Awaitable[Any]], on_entry: Callable[[Any], None], what: str,
                  on_watch: Callable[[], None] | None, watcher: Any, retry_s: float,
                  reconnected: asyncio.Event) -> NoReturn:
    from hfai.core.daemon import raise_if_cancelled

    backoff = Backoff(retry_s, max(retry_s, REWATCH_CAP_S))
    while True:
        raise_if_cancelled()  # opening a watch awaits inside nats-py, which may swallow a cancellation
        reconnected.clear()
        if watcher is None:
            try:
                watcher = await open_watch()
            except WATCH_ERRORS as e:
                log.warning("cannot watch %s yet (%s)", what, e or type(e).__name__)
                await asyncio.sleep(backoff.next())
                continue
        if on_watch is not None:
            on_watch()
        try:
            it = watcher.__aiter__()
            while True:
                try:
                    entry = await _next(it, reconnected)
                except StopAsyncIteration:
                    break
                backoff.reset()
                on_entry(entry)
            log.warning("watch of %s ended; watching anew", what)
        except _Reconnected:
            log.info("watching %s anew after a reconnect", what)
        except WATCH_ERRORS as e:
            log.warning("watch of %s failed (%s); watching anew", what, e or type(e).__name__)
        finally:
            ended, watcher = watcher, None
            try:
                await ended.stop()
            except Exception as e:  # the subscription or connection may be gone already: nothing to stop
                log.debug("watch of %s not stopped: %s", what, e)
        await asyncio.sleep(backoff.next())


async def agent_buckets(js: JetStreamContext, config: Config) -> tuple[KeyValue, KeyValue]:
    """(nodes, assign): the two buckets an agent uses. Its permissions cannot create (or even look
    at) the others, so it waits, like :func:`ensure_shared_state`, until a controller made them."""
    backoff = _setup_backoff(config)
    while True:
        try:
            return await _open(js, names.BUCKET_NODES), await _open(js, names.BUCKET_ASSIGN)
        except Exception as e:
            if not is_transient(e):
                raise
            wait_s = backoff.next()
            log.warning("hfai's buckets are not ready (%s); retrying in %.1fs", e, wait_s)
            await asyncio.sleep(wait_s)


def _setup_backoff(config: Config) -> Backoff:
    return Backoff(config.nats.setup_retry_s, max(config.nats.setup_retry_s, SETUP_RETRY_CAP_S))


async def ensure_shared_state(js: JetStreamContext, config: Config) -> Buckets:
    """The buckets and the events stream, created if missing. A daemon started together with its
    NATS cluster waits here, retrying (``setup_retry_s`` at first, then longer, jittered) while
    JetStream cannot place or answer yet; other errors (a misconfiguration such as replicas the
    servers cannot have) raise."""
    import nats.js.errors

    backoff = _setup_backoff(config)
    while True:
        try:
            buckets = await ensure_buckets(js, config)
            await ensure_events_stream(js, config)
            return buckets
        except Exception as e:
            if isinstance(e, nats.js.errors.APIError) and not is_transient(e):
                raise Unavailable(f"JetStream refused to set up hfai's buckets and stream: {e.description or e} "
                                  f"(is [nats] replicas = {config.nats.replicas} right for these servers?)") from e
            if not is_transient(e):
                raise
            wait_s = backoff.next()
            log.warning("JetStream not ready (%s); retrying in %.1fs", e, wait_s)
            await asyncio.sleep(wait_s)


async def retry_setup(step, config: Config, what: str):
    """``await step()`` until JetStream can do it: a transient refusal (a cluster still placing its
    peers: "no suitable peers for placement", a leader being elected) waits and tries again, as
    ensure_shared_state does; anything else raises. Returns what the step returns."""
    backoff = _setup_backoff(config)
    while True:
        try:
            return await step()
        except Exception as e:
            if not is_transient(e):
                raise
            wait_s = backoff.next()
            log.warning("JetStream not ready for %s (%s); retrying in %.1fs", what, e, wait_s)
            await asyncio.sleep(wait_s)


async def events_subscription(js: JetStreamContext, config: Config) -> JetStreamContext.PullSubscription:
    """The leader's durable pull consumer on the events stream (explicit acks)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    await ensure_events_stream(js, config)
    return await js.pull_subscribe(
        names.EVENTS_WILDCARD,
        durable=names.EVENTS_CONSUMER,
        stream=names.EVENTS_STREAM,
        config=ConsumerConfig(
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=config.controller.event_ack_wait_s,
            deliver_policy=DeliverPolicy.ALL,
            max_ack_pending=10000,
        ),
    )


def server_refusal(e: BaseException) -> ErrorSub:
    """Which refusal of the NATS server ``e`` reports, if any: ``CREDENTIALS_REFUSED`` (it refused
    the connection's credentials: "Authorization Violation") or ``SUBJECT_DENIED`` (it refused a
    publish outside their permissions: "Permissions Violation for Publish to "SUBJECT""), else
    ``NONE``. The one place that reads nats-py's words: it passes the server's ``-ERR`` line on
    as a plain ``nats.errors.Error`` (its ``AuthorizationError`` only where it processes the line
    itself, after connecting), so the text, matched with nats-py's own constants, is all there
    is. tests/test_auth.py holds both against a real server."""
    from nats.protocol.parser import AUTHORIZATION_VIOLATION, PERMISSIONS_ERR

    if isinstance(e, nats.errors.AuthorizationError):
        return ErrorSub.CREDENTIALS_REFUSED
    text = str(e).lower()
    if AUTHORIZATION_VIOLATION in text:
        return ErrorSub.CREDENTIALS_REFUSED
    if PERMISSIONS_ERR in text:
        return ErrorSub.SUBJECT_DENIED
    return ErrorSub.NONE


def denies(e: BaseException, subject: str) -> bool:
    """Whether ``e`` is the server refusing a publish on ``subject`` (``SUBJECT_DENIED``, see
    :func:`server_refusal`): it quotes the subject, ``... to "hfai.api.bob.stop"``."""
    return server_refusal(e) is ErrorSub.SUBJECT_DENIED and f'"{subject}"' in str(e)


async def answer(msg: Any, dispatch: Callable[[str, bytes], Awaitable[object]], service: str,
                 local_error: Callable[[OSError], str] | None = None) -> None:
    """Serve one request message with ``dispatch(subject, data)`` and always reply (when the caller
    gave a reply subject): typed hfai errors as ``ErrorReply(code, message)``, JetStream busy as
    ``unavailable``, an ``OSError`` as ``error`` when ``local_error`` words it, and anything else
    as ``internal`` (logged: a bug must not take the service down). One mapping for every service
    that answers requests (the controllers' API, the storage service)."""
    from hfai.protocol import encode
    from hfai.protocol.errors import HfaiError
    from hfai.protocol.types import ErrorReply

    reply: object
    try:
        reply = await dispatch(msg.subject, msg.data)
    except HfaiError as e:
        reply = ErrorReply(code=e.code, message=str(e), sub=e.sub.value)
    except (TimeoutError, nats.errors.Error) as e:
        # JetStream busy for a moment (a bucket changing leader, a server lost): not a bug.
        log.warning("JetStream did not answer while serving %s: %s", msg.subject, e or type(e).__name__)
        busy = Unavailable(f"the cluster's store did not answer ({e or type(e).__name__}); try again")
        reply = ErrorReply(code=busy.code, message=str(busy))
    except OSError as e:
        if local_error is None:
            log.exception("internal error serving %s", msg.subject)
            reply = ErrorReply(code="internal", message=f"internal {service} error: {e}")
        else:
            log.warning("filesystem error serving %s: %s", msg.subject, e)
            reply = ErrorReply(code="error", message=local_error(e))
    except Exception as e:
        log.exception("internal error serving %s", msg.subject)
        reply = ErrorReply(code="internal", message=f"internal {service} error: {e}")
    if msg.reply:
        try:
            await msg.respond(encode(reply))
        except Exception as e:
            log.debug("could not reply on %s: %s", msg.reply, e)
