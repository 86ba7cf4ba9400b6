"""The signing keys and the registry of credentials, kept in one directory (mode 0700).

Layout of ``root``: ``operator.seed``, ``account.seed``, ``system.seed`` (nkey seeds, 0600) and
``registry.json`` (who holds which user key, with what role, and the revoked keys). Whoever can
read this directory can mint credentials: on a cluster it lives on the operators' admin host
(``/etc/hfai/issuer``, root only), never on a GPU node; the local cluster keeps it under
``$HFAI_HOME/local/auth``.

One operator signs two accounts: ``HFAI`` (everything hfai does, JetStream on) and ``SYS`` (the
server's system account, used only to push a changed ``HFAI`` account to running servers). Users,
agents and controllers are users of ``HFAI`` whose JWTs carry their permissions
(:mod:`hfai.auth.roles`). Adding a user needs no server change at all; revoking one changes the
account JWT, which :mod:`hfai.core.accounts` hands to the servers.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from hfai._atomic import write_atomic
from hfai._extras import PLATFORM_INSTALL, MissingExtra
from hfai.auth import jwt
from hfai.auth.roles import Permissions, Role, nats_claims, permissions
from hfai.protocol import names
from hfai.protocol.errors import Conflict, InvalidRequest, NotFound

try:
    import nkeys
except ModuleNotFoundError as e:  # a job's environment: credentials are issued on the operators' hosts
    raise MissingExtra(f"issuing NATS credentials needs the platform extra (nkeys not installed): "
                       f"{PLATFORM_INSTALL}") from e

ACCOUNT_NAME = "HFAI"
SYSTEM_NAME = "SYS"
_UNLIMITED = {"subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1, "wildcards": True,
              "conn": -1, "leaf": -1}
# JetStream is on for an account whose limits give it storage (-1: no limit but the server's).
_JETSTREAM = {"mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1}


@dataclass(frozen=True)
class Holder:
    name: str
    role: Role
    public_key: str
    issued_ts: float


def _new_key(prefix: int):
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))


def write_secret(path: Path, text: str) -> None:
    """Write a file only its owner can read (created 0600, never briefly world-readable), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text, mode=0o600)


class Issuer:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.operator = self._load("operator", nkeys.PREFIX_BYTE_OPERATOR)
        self.account = self._load("account", nkeys.PREFIX_BYTE_ACCOUNT)
        self.system = self._load("system", nkeys.PREFIX_BYTE_ACCOUNT)

    @classmethod
    def open(cls, root: str | os.PathLike, create: bool = False) -> Issuer:
        """The issuer in ``root``; with ``create`` a new one (new keys) if there is none yet."""
        root = Path(root)
        if not (root / "operator.seed").exists():
            if not create:
                raise NotFound(f"no hfai issuer in {root} (keys that sign credentials); `hfai local up` makes "
                               "one for a local cluster, `hfai admin init DIR` for a real one")
            root.mkdir(parents=True, exist_ok=True)
            os.chmod(root, 0o700)
            for name, prefix in (("operator", nkeys.PREFIX_BYTE_OPERATOR), ("account", nkeys.PREFIX_BYTE_ACCOUNT),
                                 ("system", nkeys.PREFIX_BYTE_ACCOUNT)):
                write_secret(root / f"{name}.seed", _new_key(prefix).seed.decode() + "\n")
        return cls(root)

    def _load(self, name: str, prefix: int):
        try:
            key = nkeys.from_seed((self.root / f"{name}.seed").read_bytes().strip())
        except (FileNotFoundError, PermissionError) as e:
            raise NotFound(f"cannot read the issuer key {self.root / name}.seed: {e.strerror}") from None
        except nkeys.NkeysError as e:
            raise InvalidRequest(f"{self.root / name}.seed is not an nkey seed: {e}") from None
        return key

    # --------------------------------------------------------------------------- registry

    def _registry(self) -> dict:
        try:
            return json.loads((self.root / "registry.json").read_text())
        except FileNotFoundError:
            return {"holders": {}, "revocations": {}}

    def _save(self, registry: dict) -> None:
        write_atomic(str(self.root / "registry.json"), json.dumps(registry, indent=1, sort_keys=True), mode=0o600)

    def holders(self) -> list[Holder]:
        return sorted((Holder(name=n, role=Role(h["role"]), public_key=h["public_key"], issued_ts=h["issued_ts"])
                       for n, h in self._registry()["holders"].items()), key=lambda h: (h.role.value, h.name))

    def holder(self, name: str) -> Holder | None:
        return next((h for h in self.holders() if h.name == name), None)

    def revocations(self) -> dict[str, int]:
        return dict(self._registry()["revocations"])

    # --------------------------------------------------------------------------- issuing

    def issue(self, name: str, role: Role, replace: bool = False) -> str:
        """New credentials (the ``.creds`` text) for ``name`` with ``role``. A name holds one key
        at a time: re-issuing (``replace``) revokes the old key, so push the account afterwards."""
        names.check_token("name", name)
        registry = self._registry()
        old = registry["holders"].get(name)
        if old is not None and not replace:
            raise Conflict(f"{name} already has credentials (as {old['role']}); remove them first")
        if old is not None:
            registry["revocations"][old["public_key"]] = int(time.time())
        key = _new_key(nkeys.PREFIX_BYTE_USER)
        public = key.public_key.decode()
        token = jwt.encode(self.account, public, name, nats_claims(permissions(role, name)))
        registry["holders"][name] = {"role": role.value, "public_key": public, "issued_ts": time.time()}
        self._save(registry)
        return jwt.creds_text(token, key.seed)

    def revoke(self, name: str) -> Holder:
        """Revoke ``name``'s key; takes effect on the servers once the account is pushed."""
        registry = self._registry()
        held = registry["holders"].pop(name, None)
        if held is None:
            raise NotFound(f"no credentials issued to {name!r}")
        # Revokes every JWT of that key issued up to now (the server compares the JWT's iat).
        registry["revocations"][held["public_key"]] = int(time.time()) + 1
        self._save(registry)
        return Holder(name=name, role=Role(held["role"]), public_key=held["public_key"], issued_ts=held["issued_ts"])

    def system_creds(self) -> str:
        """Credentials of a system-account user, for pushing account updates (made anew each time)."""
        key = _new_key(nkeys.PREFIX_BYTE_USER)
        token = jwt.encode(self.system, key.public_key.decode(), "hfai-admin",
                           nats_claims(Permissions(pub=(">",), sub=(">",))))
        return jwt.creds_text(token, key.seed)

    # ----------------------------------------------------------------------- server side

    def operator_jwt(self) -> str:
        return jwt.encode(self.operator, self.operator.public_key.decode(), "hfai",
                          {"type": "operator", "system_account": self.system.public_key.decode()})

    def account_jwt(self) -> str:
        nats = {"type": "account", "limits": {**_UNLIMITED, **_JETSTREAM}}
        revoked = self.revocations()
        if revoked:
            nats["revocations"] = revoked
        return jwt.encode(self.operator, self.account.public_key.decode(), ACCOUNT_NAME, nats)

    def system_account_jwt(self) -> str:
        return jwt.encode(self.operator, self.system.public_key.decode(), SYSTEM_NAME,
                          {"type": "account", "limits": _UNLIMITED})

    def server_config(self, resolver_dir: str | os.PathLike) -> str:
        """The nats-server configuration block that turns on JWT auth with these keys.

        The ``full`` resolver keeps account JWTs in ``resolver_dir`` and takes updates pushed on the
        system account (a 3-server cluster passes them on to every server); the preload makes a
        fresh server know both accounts before any push."""
        return (
            f"operator: {self.operator_jwt()}\n"
            f"system_account: {self.system.public_key.decode()}\n"
            f'resolver: {{ type: full, dir: "{resolver_dir}", allow_delete: false, interval: "2m" }}\n'
            "resolver_preload: {\n"
            f"  {self.system.public_key.decode()}: {self.system_account_jwt()}\n"
            f"  {self.account.public_key.decode()}: {self.account_jwt()}\n"
            "}\n"
        )
