"""Signed-in browser sessions, kept server-side: the cookie holds only a random id. Each session
is a NATS connection made with the credentials the user pasted, so the NATS server's permissions
and the controller's checks apply to everything the user does through the web, exactly as for
the CLI. The credentials live in a 0600 file in a 0700 directory only while the session does;
they are never sent back to the browser."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from hfai.cli.client import ApiClient
from hfai.config import Config
from hfai.protocol.errors import HfaiError, InvalidRequest

log = logging.getLogger(__name__)

COOKIE = "hfai_session"
MAX_CREDS_BYTES = 16 * 1024


@dataclass
class Session:
    id: str
    api: ApiClient
    last_used: float

    @property
    def user(self) -> str:
        return self.api.user

    @property
    def operator(self) -> bool:
        return self.api.operator


class Sessions:
    def __init__(self, config: Config):
        self._config = config
        self._dir = Path(tempfile.mkdtemp(prefix="hfai-web-"))  # 0700
        self._by_id: dict[str, Session] = {}

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
        path = self._dir / f"{sid}.creds"
        path.touch(mode=0o600)
        path.write_text(creds_text)
        config = dataclasses.replace(self._config, nats=dataclasses.replace(self._config.nats, creds=str(path)))
        api = ApiClient(config)
        try:
            await api.__aenter__()
        except HfaiError:
            path.unlink(missing_ok=True)
            raise
        except Exception as e:  # e.g. a seed that is not an nkey
            path.unlink(missing_ok=True)
            why = f"those credentials cannot be used ({type(e).__name__}); paste the whole .creds file"
            raise InvalidRequest(why) from None
        session = Session(id=sid, api=api, last_used=time.monotonic())
        self._by_id[sid] = session
        log.info("%s signed in", api.user)
        return session

    def get(self, sid: str | None) -> Session | None:
        session = self._by_id.get(sid or "")
        if session is None:
            return None
        if time.monotonic() - session.last_used > self._config.web.session_idle_s:
            asyncio.ensure_future(self.sign_out(session.id))
            return None
        session.last_used = time.monotonic()
        return session

    async def sign_out(self, sid: str) -> None:
        session = self._by_id.pop(sid, None)
        if session is not None:
            await session.api.close()
            (self._dir / f"{sid}.creds").unlink(missing_ok=True)

    async def expire(self) -> None:
        now = time.monotonic()
        for sid in [s.id for s in self._by_id.values() if now - s.last_used > self._config.web.session_idle_s]:
            await self.sign_out(sid)

    async def close(self) -> None:
        """Close every session and forget every credential; safe to call twice."""
        for sid in list(self._by_id):
            await self.sign_out(sid)
        shutil.rmtree(self._dir, ignore_errors=True)
