"""Manifests too large for one NATS message, uploaded in pieces before the commit that names them.

A client whose commit request would not fit the server's max_payload sends the encoded manifest
as :class:`hfai.protocol.storage.ManifestPart` pieces of an upload id of its choosing, then
commits with that id and the manifest's SHA-256 (docs/storage.md, "Large trees"). The pieces are
written at their offsets into ``<state_dir>/uploads/<user>/<upload>`` (root only: no job reaches
it), taken whole by the commit, and removed. A user keeps at most :data:`KEEP_PER_USER` uploads
(the oldest goes: an upload a killed push left), each at most :data:`MAX_BYTES`; all are removed
when the service starts.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from hfai.protocol import names
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.storage import MAX_MANIFEST_BYTES

_UPLOAD_ID = re.compile(r"^[0-9a-f]{32}$")
MAX_BYTES = MAX_MANIFEST_BYTES
KEEP_PER_USER = 4


class Uploads:
    def __init__(self, directory: str | os.PathLike):
        self.root = Path(directory)

    def clear(self) -> None:
        """Remove every upload (at start: no push waits across a restart of the service)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.root, 0o700)

    def _path(self, user: str, upload: str) -> Path:
        if not _UPLOAD_ID.match(upload):
            raise InvalidRequest("an upload id is 32 hex digits")
        return self.root / names.check_token("user name", user) / upload

    def write(self, user: str, upload: str, offset: int, total: int, data: bytes) -> None:
        """Write one piece (blocking). Pieces may come in any order; a repeated one is rewritten."""
        if not 0 < total <= MAX_BYTES or offset < 0 or offset + len(data) > total:
            raise InvalidRequest(f"a manifest piece at {offset} of {len(data)} bytes does not fit an upload of "
                                 f"{total} bytes (at most {MAX_BYTES})")
        path = self._path(user, upload)
        path.parent.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            if os.fstat(fd).st_size == 0:
                self._make_room(path)
            while data:
                n = os.pwrite(fd, data, offset)
                data, offset = data[n:], offset + n
        finally:
            os.close(fd)

    def _make_room(self, new: Path) -> None:
        others = [p for p in new.parent.iterdir() if p != new]
        if len(others) < KEEP_PER_USER:
            return
        for old in sorted(others, key=lambda p: p.stat().st_mtime)[:len(others) - KEEP_PER_USER + 1]:
            old.unlink(missing_ok=True)

    def take(self, user: str, upload: str, digest: str) -> bytes:
        """The whole upload, removed (blocking). InvalidRequest if it is not there or its bytes are
        not those of ``digest`` (a piece lost, or two uploads mixed): the push is sent again."""
        path = self._path(user, upload)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise InvalidRequest("the manifest sent in pieces is not on the cluster (the service restarted, or "
                                 "the user's newer pushes replaced it); push again") from None
        finally:
            path.unlink(missing_ok=True)
        if hashlib.sha256(data).hexdigest() != digest:
            raise InvalidRequest("the manifest sent in pieces did not arrive whole; push again")
        return data
