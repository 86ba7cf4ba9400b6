"""NATS JWTs (claims version 2) and ``.creds`` files, as nats-server and every NATS client read them.

A JWT is ``base64url(header).base64url(claims).base64url(ed25519 signature)``, signed by the
issuer's nkey; the server checks the chain operator → account → user itself, so nothing here
needs a server. Only :func:`encode` touches a key; the rest is text.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import time
from typing import Any

from hfai.protocol.errors import InvalidRequest

HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}
_CREDS_JWT = re.compile(r"-----BEGIN NATS USER JWT-----\s*(\S+)\s*------END NATS USER JWT------")
_CREDS_SEED = re.compile(r"-----BEGIN USER NKEY SEED-----\s*(\S+)\s*------END USER NKEY SEED------")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(signer: Any, subject: str, name: str, nats: dict[str, Any], iat: int | None = None) -> str:
    """A JWT for ``subject`` (a public nkey) signed by ``signer`` (an ``nkeys.KeyPair``)."""
    claims: dict[str, Any] = {
        "iat": int(time.time() if iat is None else iat),
        "iss": signer.public_key.decode(),
        "name": name,
        "sub": subject,
        "nats": {**nats, "version": 2},
        "jti": "",
    }
    # The JWT id is a hash of the claims, as the Go library makes it: unique per token.
    digest = hashlib.sha512(json.dumps(claims, sort_keys=True).encode()).digest()[:32]
    claims["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signing_input = f"{_b64(json.dumps(HEADER).encode())}.{_b64(json.dumps(claims).encode())}"
    return f"{signing_input}.{_b64(signer.sign(signing_input.encode()))}"


def claims(token: str) -> dict[str, Any]:
    """The claims of a JWT, not verified (the server verifies; a client only reads its own)."""
    try:
        body = json.loads(_unb64(token.split(".")[1]))
    except (IndexError, ValueError, binascii.Error) as e:
        raise InvalidRequest(f"not a NATS JWT ({e})") from None
    if not isinstance(body, dict) or not isinstance(body.get("nats"), dict):
        raise InvalidRequest("not a NATS JWT (no nats claims)")
    return body


def creds_text(token: str, seed: bytes) -> str:
    """The ``.creds`` file nats-server's tooling writes: the user JWT and the user's seed."""
    return (
        "-----BEGIN NATS USER JWT-----\n"
        f"{token}\n"
        "------END NATS USER JWT------\n\n"
        "************************* IMPORTANT *************************\n"
        "NKEY Seed printed below can be used to sign and prove identity.\n"
        "NKEYs are sensitive and should be treated as secrets.\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{seed.decode()}\n"
        "------END USER NKEY SEED------\n\n"
        "*************************************************************\n"
    )


def parse_creds(text: str) -> tuple[str, str]:
    """(jwt, seed) of a ``.creds`` file's text."""
    token, seed = _CREDS_JWT.search(text), _CREDS_SEED.search(text)
    if not token or not seed:
        raise InvalidRequest("not a NATS credentials file (no user JWT and seed blocks)")
    return token.group(1), seed.group(1)
