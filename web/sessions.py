"""Signed-in browser sessions, kept server-side: the cookie holds only a random id. Each session
is a NATS connection made with the credentials the user pasted, so the NATS server's permissions
and the controller's checks apply to everything the user does through the web, exactly as for
the CLI. The credentials live in a 0600 file in a 0700 directory only while the session does;
they are never sent back to the browser. The file is named by a second random id that only this
process knows (never the cookie's: whoever could list the folder would have every session), and
no error a browser sees names it."""

from __future__ import annotations

import dataclasses
import logging
import secrets
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hfai.api.client import ApiClient
from hfai.core.clock import SYSTEM, Clock
from hfai.core.config import Config
from hfai.core.daemon import raise_if_cancelled
from hfai.protocol.errors import Forbidden, HfaiError, InvalidRequest

log = logging.getLogger(__name__)

COOKIE = "hfai_session"
MAX_CREDS_BYTES = 16 * 1024


@dataclass
class Session:
    id: str  # the cookie's value
    api: ApiClient
    last_used: float
    creds_path: Path | None = None  # its credentials file, named by another random id

    @property
    def user(self) -> str:
        return self.api.user

    @property
    def operator(self) -> bool:
        return self.api.operator


class Sessions:
    """The signed-in sessions. Each ends (its NATS connection closed, its credentials file removed)
    when its user signs out, after ``[web] session_idle_s`` without a request (checked on each
    request and every ``session_sweep_s`` by :meth:`sweep_forever`), when its connection is gone
    (e.g. the credentials were revoked), or when its user signs in more than ``sessions_per_user``
    times (the session unused longest goes). Idleness is measured on ``clock``'s monotonic time."""

    def __init__(self, config: Config, clock: Clock = SYSTEM):
        self._config = config
        self._clock = clock
        self._dir = Path(tempfile.mkdtemp(prefix="hfai-web-"))  # 0700
        self._by_id: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def of(self, user: str) -> list[Session]:
        """``user``'s sessions, the one unused longest first."""
        return sorted((s for s in self._by_id.values() if s.user == user), key=lambda s: s.last_used)

    async def sign_in(self, creds_text: str) -> Session:
        """A session acting with these credentials; InvalidRequest/Forbidden if they are not hfai
        credentials or the cluster refuses them."""
        from hfai.auth import jwt

        # A browser's form sends a textarea's lines ending in CR LF; the seed parser wants LF.
        creds_text = creds_text.replace("\r\n", "\n").replace("\r", "\n").strip() + "\n"
        if len(creds_text.encode()) > MAX_CREDS_BYTES:
            raise InvalidRequest("that is not an hfai credentials file (too large)")
        try:
            jwt.claims(jwt.parse_creds(creds_text)[0])
        except Exception:
            raise InvalidRequest("that is not an hfai credentials file (paste the whole .creds file)") from None
        sid = secrets.token_urlsafe(32)
        path = self._dir / f"{secrets.token_urlsafe(16)}.creds"
        path.touch(mode=0o600)
        path.write_text(creds_text)
        config = dataclasses.replace(self._config, nats=dataclasses.replace(self._config.nats, creds=str(path)))
        try:
            api = await _connect(config)
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        session = Session(id=sid, api=api, last_used=self._clock.monotonic(), creds_path=path)
        self._by_id[sid] = session
        log.info("%s signed in", api.user)
        await self._close_all(self._beyond_limit(api.user))
        return session

    async def get(self, sid: str | None) -> Session | None:
        """The live session ``sid`` (marked used now), or None; an idle or dead one is ended first."""
        session = self._by_id.get(sid or "")
        if session is None:
            return None
        if self._ended(session, self._clock.monotonic()):
            await self.sign_out(session.id)
            return None
        session.last_used = self._clock.monotonic()
        return session

    async def sign_out(self, sid: str) -> None:
        """End session ``sid`` (nothing if there is none); returns once it is closed."""
        session = self._by_id.pop(sid, None)
        if session is not None:
            await self._close(session)

    async def expire(self) -> int:
        """End every idle or dead session; how many were ended."""
        now = self._clock.monotonic()
        gone = [self._by_id.pop(s.id) for s in list(self._by_id.values()) if self._ended(s, now)]
        await self._close_all(gone)
        return len(gone)

    async def sweep_forever(self) -> None:
        """:meth:`expire` every ``[web] session_sweep_s``, until cancelled (hfai-web owns the task)."""
        while True:
            raise_if_cancelled()  # closing sessions awaits inside nats-py, which may swallow a cancellation
            await self._clock.sleep(self._config.web.session_sweep_s)
            ended = await self.expire()
            if ended:
                log.info("%d idle sessions ended, %d left", ended, len(self._by_id))

    async def close(self) -> None:
        """Close every session and forget every credential; safe to call twice."""
        await self._close_all([self._by_id.pop(sid) for sid in list(self._by_id)])
        shutil.rmtree(self._dir, ignore_errors=True)

    def _ended(self, session: Session, now: float) -> bool:
        return now - session.last_used > self._config.web.session_idle_s or not session.api.connected

    def _beyond_limit(self, user: str) -> list[Session]:
        """Taken out of the table: ``user``'s sessions beyond ``sessions_per_user``, unused longest first."""
        extra = self.of(user)[: max(0, len(self.of(user)) - max(1, self._config.web.sessions_per_user))]
        return [self._by_id.pop(s.id) for s in extra]

    async def _close_all(self, sessions: list[Session]) -> None:
        for session in sessions:
            await self._close(session)

    async def _close(self, session: Session) -> None:
        try:
            await session.api.close()
        finally:
            if session.creds_path is not None:
                session.creds_path.unlink(missing_ok=True)


async def _connect(config: Config) -> ApiClient:
    """A client connected with ``config``'s credentials, or a typed error (nothing left open)."""
    try:
        return await ApiClient(config).__aenter__()
    except Forbidden:
        # Its own words name the file the credentials were written to: a path of this server's.
        raise Forbidden("the cluster refused these credentials (revoked, or issued for another cluster)") from None
    except HfaiError:
        raise
    except Exception as e:  # e.g. a seed that is not an nkey
        why = f"those credentials cannot be used ({type(e).__name__}); paste the whole .creds file"
        raise InvalidRequest(why) from None
