"""Hand a changed HFAI account JWT (new revocations) to running nats-servers.

The servers' ``full`` resolver takes account updates published on ``$SYS.REQ.CLAIMS.UPDATE`` by a
system-account user and passes them on to the rest of a cluster; a server that gets a revocation
closes the revoked user's connections at once, so revocation needs no restart and no config edit.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import nats
import nats.errors

from hfai.auth.issuer import Issuer, write_secret
from hfai.core.config import Config
from hfai.core.nats import tls_options
from hfai.protocol.errors import Unavailable

CLAIMS_UPDATE = "$SYS.REQ.CLAIMS.UPDATE"


async def push_account(issuer: Issuer, config: Config) -> str:
    """Push the current account JWT to the cluster's servers; returns the server's message."""
    url, timeout_s = config.nats.url, config.nats.request_timeout_s
    servers = [u.strip() for u in url.split(",") if u.strip()]
    with tempfile.TemporaryDirectory(prefix="hfai-push-") as tmp:
        creds = f"{tmp}/system.creds"
        write_secret(Path(creds), issuer.system_creds())
        try:
            nc = await nats.connect(servers, user_credentials=creds, allow_reconnect=False,
                                    connect_timeout=config.nats.connect_timeout_s, max_reconnect_attempts=0,
                                    **tls_options(config))
        except (OSError, nats.errors.Error) as e:
            raise Unavailable(f"cannot reach NATS at {url} to push the account: {e}") from None
        try:
            msg = await nc.request(CLAIMS_UPDATE, issuer.account_jwt().encode(), timeout=timeout_s)
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as e:
            raise Unavailable(f"no server answered the account update on {url} ({type(e).__name__})") from None
        finally:
            await nc.close()
    reply = json.loads(msg.data)
    if reply.get("error"):
        raise Unavailable(f"the server refused the account update: {reply['error'].get('description', reply)}")
    return reply.get("data", {}).get("message", "updated")

