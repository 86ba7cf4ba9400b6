"""Workspaces on the shared filesystem: ``<workspace_root>/<user>/<name>``, and their manifests
in the service's state directory. The thin I/O side of :mod:`hfai.storage.rules`.

Written as root (in production) and handed to the user: the user's directory is theirs, mode
0700, so no other user (nor their jobs) can read it. A commit is all or nothing as jobs see it
(:mod:`hfai.storage.commit`); a commit the service was killed in is finished or undone by
:meth:`Workspaces.recover` when it starts again.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
import stat
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from hfai._atomic import write_atomic
from hfai.protocol import decode, encode, names
from hfai.protocol.codec import encode_packed, pack
from hfai.protocol.errors import InvalidRequest, NotFound, ProtocolError
from hfai.protocol.storage import MAX_MANIFEST_BYTES, ChunkData, CommitJournal, Manifest, WorkspaceInfo
from hfai.storage import commit as commit_mod
from hfai.storage import rules
from hfai.storage.beneath import Tree
from hfai.storage.chunks import chunk_matches
from hfai.storage.files import account, chown, remove_tree

log = logging.getLogger(__name__)

#: How long after held() its present() result stands in for the commit's own (see
#: Workspaces.present_and_held): ws_commit's commit follows its held() within milliseconds.
_PRESENT_REUSE_S = 1.0


class Workspaces:
    def __init__(self, root: str | os.PathLike, state_dir: str | os.PathLike, defer_removal: bool = False):
        """``defer_removal``: a commit's used side tree is only renamed aside (:meth:`discard`);
        the caller removes it later (:meth:`remove_discarded`), as the service does after its reply."""
        self.root = Path(root)
        self.defer_removal = defer_removal
        self._discarded: list[Path] = []
        self.manifests = Path(state_dir) / "manifests"
        self.root.mkdir(parents=True, exist_ok=True)
        self.manifests.mkdir(parents=True, exist_ok=True)
        os.chmod(self.manifests.parent, 0o700)
        self._decoded: dict[Path, tuple[tuple[int, int], Manifest]] = {}
        self._digests: dict[Path, tuple[tuple[int, int], str]] = {}
        # (user, name, manifest, present(), held_chunks(), monotonic time) of the last held(), for
        # the commit that follows it (present_and_held).
        self._last_held: tuple[str, str, Manifest | None, dict[str, int], dict[str, tuple[str, int]], float] \
            | None = None

    def path(self, user: str, name: str) -> Path:
        return self.root / names.check_token("user name", user) / rules.check_workspace_name(name)

    def _manifest_path(self, user: str, name: str) -> Path:
        return self.manifests / names.check_token("user name", user) / f"{rules.check_workspace_name(name)}.manifest"

    def manifest(self, user: str, name: str) -> Manifest | None:
        """The last committed manifest (decoded once per version: a 10,000-file one takes a while)."""
        p = self._manifest_path(user, name)
        try:
            st = p.stat()
            hit = self._decoded.get(p)
            if hit is not None and hit[0] == (st.st_mtime_ns, st.st_size):
                return hit[1]
            m = decode(p.read_bytes(), Manifest, max_bytes=MAX_MANIFEST_BYTES)
        except (FileNotFoundError, ProtocolError):
            return None
        if len(self._decoded) > 64:
            self._decoded.clear()
        self._decoded[p] = ((st.st_mtime_ns, st.st_size), m)
        return m

    def is_current(self, user: str, name: str, digest: str) -> bool:
        """Whether the last committed manifest has ``digest`` (:func:`rules.manifest_digest`), no
        commit of it is left to finish, and its files are all on disk at their sizes (blocking)."""
        p = self._manifest_path(user, name)
        try:
            st = p.stat()
            key = (st.st_mtime_ns, st.st_size)
            hit = self._digests.get(p)
            if hit is None or hit[0] != key:
                if len(self._digests) > 1024:
                    self._digests.clear()
                hit = self._digests[p] = (key, rules.digest_bytes(p.read_bytes()))
        except FileNotFoundError:
            return False
        if hit[1] != digest or self._journal_path(user, name).exists():
            return False
        m = self.manifest(user, name)
        return m is not None and rules.up_to_date(m, self.present(user, name, m))

    def manifest_bytes(self, user: str, name: str) -> tuple[bytes, str]:
        """The last committed manifest as recorded (``encode()``'s bytes) and their SHA-256;
        NotFound if none (blocking)."""
        p = self._manifest_path(user, name)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise NotFound(f"no workspace {name!r}; `hfai workspace push` it first") from None
        return data, rules.digest_bytes(data)

    def save_manifest(self, user: str, name: str, m: Manifest, packed: bytes | None = None) -> None:
        """Record ``m`` (``packed``: :func:`hfai.protocol.codec.pack` of it, when the caller has
        it). The bytes are ``encode(m)``'s, whose SHA-256 is what ``ws_current`` compares."""
        p = self._manifest_path(user, name)
        p.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(p, encode(m) if packed is None else _envelope(Manifest) + packed, mode=0o600)
        # What manifest() would decode from that file next (a 10,000-file one: 0.17 s) is ``m``.
        st = p.stat()
        if len(self._decoded) > 64:
            self._decoded.clear()
        self._decoded[p] = ((st.st_mtime_ns, st.st_size), m)

    def present(self, user: str, name: str, m: Manifest | None) -> dict[str, int]:
        """path -> size on disk of the files ``m`` lists (regular files only)."""
        return self._sizes(user, name, [f.path for f in m.files] if m else [])

    def _sizes(self, user: str, name: str, paths: list[str]) -> dict[str, int]:
        """path -> size on disk of those of ``paths`` (relative to the workspace) that are regular files."""
        out: dict[str, int] = {}
        if not paths:
            return out
        try:
            tree = Tree.of(self.path(user, name))
        except OSError:  # no workspace (or not a directory): none of its files is there
            return out
        with tree:
            for path in paths:
                try:
                    # Relative to the workspace's descriptors, strings: Path's parsing, and
                    # resolving the whole absolute path again, would cost more than the lstat.
                    # Never through a symlink a job made of a directory: that file is not there.
                    st = tree.lstat(path)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[path] = st.st_size
        return out

    def read_chunks(self, user: str, name: str, hashes: Iterable[str], chunk_bytes: int) -> tuple[ChunkData, ...]:
        """The chunks ``hashes`` read from the workspace's files (a pull; blocking). Each is
        checked against its hash before it is sent: a job may have made a file a hard link to
        one outside the workspace (docs/security.md). InvalidRequest when one is not held, or
        its file no longer holds it (the client lists the workspace again)."""
        wanted = tuple(hashes)
        if not wanted:
            return ()
        held = self.held(user, name)
        gone = next((h for h in wanted if h not in held), None)
        if gone is not None:
            raise InvalidRequest(f"the workspace has no chunk {gone[:16]}… any more; list it again")
        out = []
        with Tree.of(self.path(user, name)) as tree:
            for h in wanted:
                path, offset = held[h]
                try:
                    fd = tree.open_regular(path)
                    try:
                        data = os.pread(fd, chunk_bytes, offset)
                    finally:
                        os.close(fd)
                except OSError:
                    data = b""
                if not chunk_matches(h, data):
                    raise InvalidRequest(f"{path[:80]!r} changed on the cluster since it was pushed; list it again")
                out.append(ChunkData(hash=h, data=data))
        return tuple(out)

    def discard(self, tree: Path) -> None:
        """Remove the directory ``tree`` (a commit's used side tree), now or, deferring, once
        renamed to a name no commit uses (any left by a kill are removed at start)."""
        if not self.defer_removal:
            remove_tree(tree)
            return
        import secrets

        gone = tree.with_name(f"{commit_mod.GONE_PREFIX}{tree.name}.{secrets.token_hex(6)}")
        try:
            os.rename(tree, gone)
        except FileNotFoundError:
            return
        self._discarded.append(gone)

    def take_discarded(self) -> list[Path]:
        """The trees :meth:`discard` renamed aside since the last call, for the caller to remove."""
        out, self._discarded = self._discarded, []
        return out

    def holding(self, user: str, name: str, hashes: Iterable[str]) -> set[str]:
        """Those of ``hashes`` that the workspace's files hold on disk (as :meth:`held` would
        say), looking only at the files the last manifest lists them in: a push of one edited
        file asks about its chunk, and one lstat answers, not one for every file of the tree."""
        m = self.manifest(user, name)
        asked = set(hashes)
        if m is None or not asked:
            return set()
        # One pass of set lookups (each commit's manifest is new: a hash -> files map made for
        # it took longer than the lstats it saves).
        candidates = [f for f in m.files if not asked.isdisjoint(f.chunks)]
        present = self._sizes(user, name, [f.path for f in candidates])
        return {h for f in candidates if present.get(f.path) == f.size for h in f.chunks if h in asked}

    def held(self, user: str, name: str) -> dict[str, tuple[str, int]]:
        old = self.manifest(user, name)
        present = self.present(user, name, old)
        held = rules.held_chunks(old, present)
        self._last_held = (user, name, old, present, held, time.monotonic())
        return held

    def present_and_held(self, user: str, name: str, m: Manifest | None) \
            -> tuple[dict[str, int], dict[str, tuple[str, int]]]:
        """present() and held_chunks() of ``m`` for a commit: those of the held() just before,
        for the same manifest, where there was one (ws_commit asks held() whether every chunk
        is there, then commits: one lstat of each file, not two). Results that old are as good
        as fresh ones: a file a job removes or resizes after them is met by the commit's own
        steps (a link that fails, a chunk checked as it is read) exactly as one changed a moment
        after a fresh present()."""
        last, self._last_held = self._last_held, None
        if last is not None:
            l_user, l_name, l_m, present, held, at = last
            if (l_user, l_name) == (user, name) and l_m is m and time.monotonic() - at < _PRESENT_REUSE_S:
                return present, held
        present = self.present(user, name, m)
        return present, rules.held_chunks(m, present)

    # -------------------------------------------------------------------------------- commit

    async def commit(self, user: str, name: str, new: Manifest, staged: commit_mod.ReadStaged,
                     locate: commit_mod.LocateStaged | None = None, packed: bytes | None = None) -> rules.CommitPlan:
        """Make the workspace on disk what ``new`` says, all or nothing as seen by jobs
        (:mod:`hfai.storage.commit`); chunks come from the files already there when they have
        them, else from staging (``locate``: where a staged chunk's bytes lie, copied in the
        kernel; ``staged``: its bytes). Both are called from the commit's thread, which does the
        file work, so the service keeps answering meanwhile (a pushing client asks whether its
        commit is still going). ``packed``: ``new`` as its request carried it, packed (recorded
        as it is, not packed again)."""
        return await asyncio.to_thread(commit_mod.commit, self, user, name, new, staged, locate, packed)

    def _journal_path(self, user: str, name: str) -> Path:
        return self._manifest_path(user, name).with_suffix(".journal")

    def save_journal(self, user: str, journal: CommitJournal, packed: bytes | None = None) -> None:
        """``packed``: :func:`hfai.protocol.codec.pack` of ``journal.manifest``, when the caller
        has it (a commit writes two or three records of one manifest). The bytes are
        ``encode(journal)``'s either way, so any version of the service reads them."""
        p = self._journal_path(user, journal.workspace)
        p.parent.mkdir(parents=True, exist_ok=True)
        data = encode(journal) if packed is None else encode_packed(journal, manifest=packed).data
        write_atomic(p, data, mode=0o600)

    def journal(self, user: str, name: str) -> CommitJournal | None:
        """The record of a commit of this workspace a killed service left, if any (an unreadable
        one is dropped: the workspace then keeps what is on disk)."""
        p = self._journal_path(user, name)
        try:
            journal = decode(p.read_bytes(), CommitJournal, max_bytes=MAX_MANIFEST_BYTES + 4096)
        except FileNotFoundError:
            return None
        except (OSError, ProtocolError):
            journal = None
        if journal is None or journal.workspace != name:
            log.warning("%s: unreadable commit journal; the workspace keeps what is on disk", p)
            p.unlink(missing_ok=True)
            return None
        return journal

    def drop_journal(self, user: str, name: str) -> None:
        self._journal_path(user, name).unlink(missing_ok=True)

    def forget(self, user: str, name: str, paths: Iterable[str]) -> None:
        """Drop ``paths`` (and what lies below them) from the workspace's manifest: the cluster no
        longer vouches for their content, so a later push sends them again."""
        m = self.manifest(user, name)
        gone = tuple(paths)
        if m is None or not gone:
            return
        kept = tuple(f for f in m.files if not any(f.path == r or f.path.startswith(r + "/") for r in gone))
        if len(kept) != len(m.files):
            self.save_manifest(user, name, replace(m, files=kept))

    def recover(self) -> list[tuple[str, str, str]]:
        """At start, before serving: finish or undo every commit a killed service left, and remove
        its temporary files and trees; returns (user, workspace, "finished"/"undone") of each."""
        done = []
        pending: set[Path] = set()  # their side trees may be the old directory: keep them
        for jpath in sorted(self.manifests.glob("*/*.journal")):
            user, name = jpath.parent.name, jpath.stem
            journal = self.journal(user, name)
            if journal is None:
                continue
            try:
                done.append((user, name, commit_mod.recover(self, user, journal)))
                commit_mod.clean_temporaries(self.path(user, name))
            except OSError:  # serve the others; this workspace's next commit tries again
                log.exception("%s/%s: could not finish or undo its last commit", user, name)
                pending.add(self.path(user, name))
        for leftover in self.manifests.glob("*/*.tmp.*"):  # write_atomic's, of a kill mid-write
            leftover.unlink(missing_ok=True)
        for user in self.users():
            for side in (self.root / user).glob(commit_mod.NEXT_PREFIX + "*"):
                if side.with_name(side.name[len(commit_mod.NEXT_PREFIX):]) not in pending:
                    remove_tree(side)
            for gone in (self.root / user).glob(commit_mod.GONE_PREFIX + "*"):
                remove_tree(gone)
        return done

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
        shutil.rmtree(commit_mod.next_path(self.path(user, name)), ignore_errors=True)
        self._manifest_path(user, name).unlink(missing_ok=True)
        self.drop_journal(user, name)
        return info

    def users(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and names.is_token(p.name)) \
            if self.root.is_dir() else []

    def usage(self, user: str) -> int:
        """Bytes of the regular files under the user's directory (links not followed)."""
        return tree_bytes(self.root / names.check_token("user name", user))

    def user_dir(self, user: str) -> pwd.struct_passwd | None:
        """Make ``<root>/<user>`` (0700, the user's when the service runs as root and the node
        knows the account); returns the account to hand files to (None: keep the service's)."""
        d = self.root / user
        d.mkdir(mode=0o700, exist_ok=True)
        owner = account(user)
        chown(d, owner)
        os.chmod(d, 0o700)
        return owner


def packed_body(whole: bytes) -> bytes | None:
    """The packed body of ``whole``, an encoded manifest (:meth:`Workspaces.save_manifest`'s
    ``packed``), or None if it is not laid out as ``encode()`` writes one."""
    head = _envelope(Manifest)
    return whole[len(head):] if whole.startswith(head) else None


def _envelope(tp: type) -> bytes:
    """What ``encode()`` writes before a message of type ``tp``'s packed body (the same for every
    message of that type): ``encode(m) == _envelope(type(m)) + pack(m)``."""
    head = _ENVELOPES.get(tp)
    if head is None:
        empty = tp()
        whole, body = encode(empty), pack(empty)
        assert whole.endswith(body), tp
        head = _ENVELOPES[tp] = whole[:len(whole) - len(body)]
    return head


_ENVELOPES: dict[type, bytes] = {}


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


def remove_trees(trees: list[Path]) -> None:
    """Remove directory trees (blocking: the service does it in a thread after its reply)."""
    for tree in trees:
        remove_tree(tree)
