"""Workspaces on the shared filesystem: ``<workspace_root>/<user>/<name>``, and their manifests
in the service's state directory. The thin I/O side of :mod:`hfai.storage.plan`.

Written as root (in production) and handed to the user: the user's directory is theirs, mode
0700, so no other user (nor their jobs) can read it. Every file is written to a temporary name in
its directory and renamed, so a job never sees half a file.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

from hfai._atomic import write_atomic
from hfai.protocol import decode, encode, names
from hfai.protocol.errors import Conflict, NotFound, ProtocolError
from hfai.protocol.storage import FileEntry, Manifest, WorkspaceInfo
from hfai.storage import plan
from hfai.storage.chunks import chunk_hash

ReadChunk = Callable[[str], Awaitable[bytes]]


class Workspaces:
    def __init__(self, root: str | os.PathLike, state_dir: str | os.PathLike):
        self.root = Path(root)
        self.manifests = Path(state_dir) / "manifests"
        self.root.mkdir(parents=True, exist_ok=True)
        self.manifests.mkdir(parents=True, exist_ok=True)
        os.chmod(self.manifests.parent, 0o700)
        self._decoded: dict[Path, tuple[tuple[int, int], Manifest]] = {}

    def path(self, user: str, name: str) -> Path:
        return self.root / names.check_token("user name", user) / plan.check_workspace_name(name)

    def _manifest_path(self, user: str, name: str) -> Path:
        return self.manifests / names.check_token("user name", user) / f"{plan.check_workspace_name(name)}.manifest"

    def manifest(self, user: str, name: str) -> Manifest | None:
        """The last committed manifest (decoded once per version: a 10,000-file one takes a while)."""
        p = self._manifest_path(user, name)
        try:
            st = p.stat()
            hit = self._decoded.get(p)
            if hit is not None and hit[0] == (st.st_mtime_ns, st.st_size):
                return hit[1]
            m = decode(p.read_bytes(), Manifest)
        except (FileNotFoundError, ProtocolError):
            return None
        if len(self._decoded) > 64:
            self._decoded.clear()
        self._decoded[p] = ((st.st_mtime_ns, st.st_size), m)
        return m

    def save_manifest(self, user: str, name: str, m: Manifest) -> None:
        p = self._manifest_path(user, name)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, encode(m), mode=0o600)

    def present(self, user: str, name: str, m: Manifest | None) -> dict[str, int]:
        """path -> size on disk of the files ``m`` lists (regular files only)."""
        base, out = self.path(user, name), {}
        for f in (m.files if m else ()):
            try:
                st = os.lstat(base / f.path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[f.path] = st.st_size
        return out

    def held(self, user: str, name: str) -> dict[str, tuple[str, int]]:
        old = self.manifest(user, name)
        return plan.held_chunks(old, self.present(user, name, old))

    # -------------------------------------------------------------------------------- commit

    async def commit(self, user: str, name: str, new: Manifest, staged: ReadChunk) -> plan.CommitPlan:
        """Make the workspace on disk what ``new`` says; chunks come from the files already there
        when they have them, else from ``staged`` (the object store)."""
        old = self.manifest(user, name)
        present = self.present(user, name, old)
        todo = plan.commit_plan(old, new, present)
        base = self.path(user, name)
        owner = self._user_dir(user)
        base.mkdir(exist_ok=True)
        _chown(base, owner)
        held = plan.held_chunks(old, present)
        # Every new file is assembled first (reading held chunks from the old files), then all are
        # renamed into place: a chunk held in a file that is itself rewritten is still the old one.
        done: list[tuple[Path, Path]] = []
        try:
            for f in todo.write:
                done.append(await self._write(base, f, new.chunk_bytes, held, old.chunk_bytes if old else 0,
                                              staged, owner))
        except BaseException:
            for tmp, _ in done:
                tmp.unlink(missing_ok=True)
            raise
        for tmp, target in done:
            if target.is_dir() and not target.is_symlink():
                shutil.rmtree(target)
            os.replace(tmp, target)
        for f in todo.chmod:
            os.chmod(base / f.path, f.mode)
        for rel in todo.delete:
            try:
                os.unlink(base / rel)
            except (FileNotFoundError, IsADirectoryError):
                pass
        _prune_empty_dirs(base)
        self.save_manifest(user, name, new)
        return todo

    async def _write(self, base: Path, f: FileEntry, chunk_bytes: int, held: dict[str, tuple[str, int]],
                     old_chunk_bytes: int, staged: ReadChunk, owner: pwd.struct_passwd | None) -> tuple[Path, Path]:
        """Assemble ``f`` in a temporary file beside its target; returns (temporary, target)."""
        target = base / f.path
        _make_parents(base, target.parent, owner)
        tmp = target.with_name(f".{target.name}.hfai-tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            with open(fd, "wb") as out:
                for h in f.chunks:
                    if h in held and old_chunk_bytes == chunk_bytes:
                        path, offset = held[h]
                        with open(base / path, "rb") as src:
                            src.seek(offset)
                            data = src.read(chunk_bytes)
                        if chunk_hash(data) != h:
                            raise Conflict(f"{path} changed on the cluster since it was pushed; push again")
                    else:
                        data = await staged(h)
                    out.write(data)
            os.chmod(tmp, f.mode & 0o777)
            _chown(tmp, owner)
            return tmp, target
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    # ------------------------------------------------------------------------- list, usage

    def info(self, user: str, name: str) -> WorkspaceInfo:
        m = self.manifest(user, name)
        if m is None:
            raise NotFound(f"no workspace {name!r}; `hfai workspace push` it first")
        try:
            ts = self._manifest_path(user, name).stat().st_mtime
        except FileNotFoundError:
            ts = 0.0
        return WorkspaceInfo(name=name, path=str(self.path(user, name)), files=len(m.files),
                             bytes=sum(f.size for f in m.files), pushed_ts=ts)

    def listing(self, user: str) -> tuple[WorkspaceInfo, ...]:
        d = self.manifests / names.check_token("user name", user)
        if not d.is_dir():
            return ()
        return tuple(self.info(user, p.stem) for p in sorted(d.glob("*.manifest")))

    def remove(self, user: str, name: str) -> WorkspaceInfo:
        info = self.info(user, name)
        shutil.rmtree(self.path(user, name), ignore_errors=True)
        self._manifest_path(user, name).unlink(missing_ok=True)
        return info

    def users(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and names.is_token(p.name)) \
            if self.root.is_dir() else []

    def usage(self, user: str) -> int:
        """Bytes of the regular files under the user's directory (links not followed)."""
        return tree_bytes(self.root / names.check_token("user name", user))

    def _user_dir(self, user: str) -> pwd.struct_passwd | None:
        """Make ``<root>/<user>`` (0700, the user's when the service runs as root and the node
        knows the account); returns the account to hand files to (None: keep the service's)."""
        d = self.root / user
        d.mkdir(mode=0o700, exist_ok=True)
        owner = _account(user)
        _chown(d, owner)
        os.chmod(d, 0o700)
        return owner


def tree_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for fn in files:
            try:
                st = os.lstat(os.path.join(dirpath, fn))
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def _account(user: str) -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None
    return pw if pw.pw_uid != 0 else None


def _chown(path: Path, owner: pwd.struct_passwd | None) -> None:
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def _make_parents(base: Path, parent: Path, owner: pwd.struct_passwd | None) -> None:
    """Create the directories between ``base`` and ``parent``; a non-directory in the way (a file
    the new manifest replaces by a directory) is removed."""
    rel = parent.relative_to(base)
    cur = base
    for part in rel.parts:
        cur = cur / part
        if cur.is_symlink() or (cur.exists() and not cur.is_dir()):
            cur.unlink()
        if not cur.exists():
            cur.mkdir()
            _chown(cur, owner)


def _prune_empty_dirs(base: Path) -> None:
    for dirpath, dirs, files in os.walk(base, topdown=False):
        if dirpath != str(base) and not dirs and not files:
            try:
                os.rmdir(dirpath)
            except OSError:
                pass
