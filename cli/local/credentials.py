"""A local cluster's credentials: the issuer under ``auth/`` that signs them (hfai.auth.issuer),
each daemon's under ``auth/creds/``, the users' under ``creds/`` (the CLI looks there)."""

from __future__ import annotations

from pathlib import Path

from hfai.auth.roles import Permissions, from_claims, permissions
from hfai.cli.local.layout import Layout
from hfai.protocol import names
from hfai.protocol.errors import HfaiError


class Credentials:
    def __init__(self, layout: Layout):
        self.layout = layout

    def issuer(self):
        from hfai.auth.issuer import Issuer

        return Issuer.open(self.layout.auth, create=True)

    def server_auth_config(self, resolver_dir: Path) -> str:
        """The nats-server config block that makes a server trust this cluster's credentials."""
        return self.issuer().server_config(resolver_dir)

    def _creds(self, path: Path, name: str, role) -> Path:
        """``path``, holding credentials of ``name`` with ``role``; issued if missing (a stale
        registration without its file is replaced, which revokes the lost key), or if the file
        grants other permissions than the role has now (the role's permissions changed since)."""
        from hfai.auth.issuer import write_secret

        issuer = self.issuer()
        held = issuer.holder(name)
        if path.exists() and held is not None and held.role is role and _grants(path) == permissions(role, name):
            return path
        write_secret(path, issuer.issue(name, role, replace=held is not None))
        return path

    def user(self, name: str, operator: bool = False) -> Path:
        """A user's credentials file in the layout's ``creds_dir`` (made on first use)."""
        from hfai.auth.roles import Role

        self.layout.creds_dir.mkdir(parents=True, exist_ok=True)
        return self._creds(self.layout.creds_dir / f"{names.check_token('user name', name)}.creds", name,
                           Role.OPERATOR if operator else Role.USER)

    def service(self, name: str, role) -> Path:
        """A daemon's credentials, readable by the cluster's owner only."""
        return self._creds(self.layout.auth / "creds" / f"{name}.creds", name, role)


def _grants(path: Path) -> Permissions | None:
    """The permissions signed into a credentials file (None: unreadable)."""
    from hfai.auth import jwt

    try:
        return from_claims(jwt.claims(jwt.parse_creds(path.read_text())[0])["nats"])
    except (OSError, HfaiError, KeyError):
        return None
