"""Committing a pushed manifest into a workspace, all or nothing as seen by jobs, and finishing or
undoing a commit a killed service left (docs/storage.md, "What a commit looks like to jobs").

A commit of ``<user>/<name>`` (the directory jobs run in; call it D):

1. **build**: assemble the whole new tree N at ``<user>/.hfai-next-<name>``: new and changed
   files are written, every other file (unchanged ones, and files jobs wrote that no manifest
   lists) is a hard link to D's. D is untouched.
2. journal :attr:`Phase.BUILT` (the new manifest, the inodes of D and N) in the state directory;
   **swap** D and N in one ``renameat2(RENAME_EXCHANGE)``: the path now resolves to N, exactly
   the pushed tree. A first commit (no D) is one ``rename`` of N into place, and done.
3. **apply** the same change to D (now at the side name) file by file (hard links of N's
   written or copied files renamed over D's, removed files unlinked: every other file of N is
   D's own inode already), so jobs already running in D, whose working directory is D itself,
   keep it and whatever they write into it. Only the in-place fallback journals
   :attr:`Phase.APPLYING` first: swapped, N's inode at the path says D may be half done.
4. journal :attr:`Phase.APPLIED`; **swap back**: the path resolves to D again, now the pushed tree
   too; remove N, record the manifest, drop the journal.

A reader resolving the path sees D before step 2, N between 2 and 4, D after: the old tree or the
new one, never a mix. Killed anywhere, :func:`recover` (run at start) decides from the journal and
which inode is at the path: before the swap it removes N (the old tree stays, exactly); after it,
it redoes the apply step (every step is idempotent) and finishes. Where the filesystem cannot
exchange (:mod:`hfai.storage.swap`), steps 2 and 4 are skipped and readers see the apply step's
file-by-file renames, each atomic but not the whole; the journal still makes a killed commit
finish at start.

``HFAI_STORAGE_FAULT=<point>`` (tests only) stops the service process (SIGSTOP) at that point of
every commit: ``built``, ``swapped``, ``applied``, so a test can look at the tree and kill it.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import logging
import os
import pwd
import signal
import stat
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from hfai.protocol.codec import pack
from hfai.protocol.errors import Conflict
from hfai.protocol.storage import CommitJournal, FileEntry, Manifest
from hfai.storage import rules, swap
from hfai.storage.beneath import Tree
from hfai.storage.chunks import chunk_matches
from hfai.storage.files import (
    fchown,
    ino,
    ino_at,
    make_new_parents_at,
    make_parents_at,
    prune_empty_dirs,
    remove_at,
    remove_tree,
)
from hfai.storage.staging import is_whole

if TYPE_CHECKING:
    from hfai.storage.staging import Located
    from hfai.storage.workspace import Workspaces

log = logging.getLogger(__name__)

#: The assembled tree's name beside the workspace (workspace names never start with '.').
NEXT_PREFIX = ".hfai-next-"
#: A used side tree, renamed out of the way to be removed after the commit's reply (unlinking a
#: large tree would be most of a one-edit push): ``.hfai-gone-<name>.<id>``.
GONE_PREFIX = ".hfai-gone-"
#: Temporary names inside a workspace while a file is renamed into place (a killed commit's are
#: removed by :func:`clean_temporaries`).
TMP_SUFFIX = ".hfai-tmp"
FAULT_ENV = "HFAI_STORAGE_FAULT"

ReadStaged = Callable[[str], bytes]  # a staged chunk by hash; KeyError if none is staged
# Where a staged chunk's bytes lie (a file with .path, .offset, .length), None if not staged.
LocateStaged = Callable[[str], "Located | None"]


class Phase(enum.Enum):
    """How far a journaled commit got. BUILT -> APPLYING -> APPLIED, then the journal is removed.
    BUILT: N is complete, D untouched (swapped or not: the inode at the path tells). APPLYING: D
    is being changed file by file. APPLIED: D holds the new tree."""

    BUILT = "built"
    APPLYING = "applying"
    APPLIED = "applied"


def next_path(base: Path) -> Path:
    return base.with_name(NEXT_PREFIX + base.name)


def _fault(point: str) -> None:
    if os.environ.get(FAULT_ENV) == point:
        log.warning("%s=%s: stopping this process here", FAULT_ENV, point)
        # To this thread, not the process: a process-directed SIGSTOP may be taken by another
        # thread (the event loop's), and the commit thread, told to stop a moment later, runs on
        # meanwhile: far enough, sometimes, to swap the new tree in before it stops.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


# ---------------------------------------------------------------------------------- commit

def commit(ws: Workspaces, user: str, name: str, new: Manifest, read: ReadStaged,
           locate: LocateStaged | None = None, packed: bytes | None = None) -> rules.CommitPlan:
    """Make the workspace what ``new`` says (blocking; see the module docstring for the steps).
    Staged chunks are copied in the kernel from where ``locate`` says they are, else read.
    ``packed``: ``new`` packed (:func:`hfai.protocol.codec.pack`), as its request carried it.
    Raises Conflict, changing nothing, when a file on the cluster no longer holds the chunks its
    manifest says and no staged copy exists; those files are forgotten, so the next push sends
    them again."""
    base = ws.path(user, name)
    left = ws.journal(user, name)
    if left is not None:  # recovery at start failed for it: never build over a half-done commit
        recover(ws, user, left)
    owner = ws.user_dir(user)
    old = ws.manifest(user, name) if base.is_dir() else None
    present, held_all = ws.present_and_held(user, name, old)
    todo = rules.commit_plan(old, new, present)
    held = held_all if old is not None and old.chunk_bytes == new.chunk_bytes else {}
    nxt = next_path(base)
    remove_tree(nxt)
    if old is not None and not (todo.write or todo.chmod or todo.delete):
        ws.save_manifest(user, name, new, packed)  # nothing on disk changes (an unchanged push)
        return todo
    try:
        stray = _build(base, nxt, new, todo, held, _Source(read, locate), owner)
    except _Changed as e:
        remove_tree(nxt)
        ws.forget(user, name, e.paths)
        raise
    except BaseException:
        remove_tree(nxt)
        raise
    journal = CommitJournal(workspace=name, manifest=new, delete=todo.delete + stray, old_ino=ino(base),
                            new_ino=ino(nxt), phase=Phase.BUILT.value)
    if packed is None:
        packed = pack(new)  # the manifest's bytes, packed once for every journal write and the record
    ws.save_journal(user, journal, packed)
    _fault("built")
    if journal.old_ino == 0:
        os.rename(nxt, base)
    else:
        # Only the files N does not share with D: every other one is D's own inode, linked.
        changed = tuple(f.path for f in todo.write + todo.chmod)
        _swap_in(ws, user, base, journal, packed, changed, owner)
    _finish(ws, user, journal, packed)
    return todo


def _swap_in(ws: Workspaces, user: str, base: Path, journal: CommitJournal, packed: bytes,
             changed: tuple[str, ...], owner: pwd.struct_passwd | None) -> None:
    nxt = next_path(base)
    swapped = swap.exchange(base, nxt)
    if not swapped:
        log.warning("%s: this filesystem cannot swap directories; replacing files in place", base)
    _fault("swapped")
    _apply_and_return(ws, user, base, journal, packed, changed, owner, swapped)


def _apply_and_return(ws: Workspaces, user: str, base: Path, journal: CommitJournal, packed: bytes,
                      paths: tuple[str, ...], owner: pwd.struct_passwd | None, swapped: bool) -> None:
    """Steps 3 and 4: bring D's ``paths`` (and deletions) up to date (D is at the side name when
    ``swapped``), swap back. Swapped, no APPLYING record is needed: N's inode at the path says
    that D may be half done; in place, only the journal can say it."""
    nxt = next_path(base)
    d, n = (nxt, base) if swapped else (base, nxt)
    if not swapped:
        ws.save_journal(user, _with_phase(journal, Phase.APPLYING), packed)
    _apply(d, n, paths, journal.delete, owner)
    ws.save_journal(user, _with_phase(journal, Phase.APPLIED), packed)
    _fault("applied")
    if swapped and not swap.exchange(base, nxt):
        raise OSError(f"could not swap {base} back with {nxt}")


def _finish(ws: Workspaces, user: str, journal: CommitJournal, packed: bytes) -> None:
    ws.discard(next_path(ws.path(user, journal.workspace)))
    ws.save_manifest(user, journal.workspace, journal.manifest, packed)
    ws.drop_journal(user, journal.workspace)


def _with_phase(j: CommitJournal, phase: Phase) -> CommitJournal:
    return CommitJournal(workspace=j.workspace, manifest=j.manifest, delete=j.delete, old_ino=j.old_ino,
                         new_ino=j.new_ino, phase=phase.value)


# ----------------------------------------------------------------------------------- build

class _Source:
    """Staged chunks for one build: copied file to file in the kernel where their file is known
    (``copy_file_range``; the bytes never enter Python), else read. Keeps its pack files open."""

    def __init__(self, read: ReadStaged, locate: LocateStaged | None):
        self._read, self._locate = read, locate
        self._fds: dict[str, int] = {}
        self._linked: set[str] = set()  # staged files this build made files of N (once each)

    def link(self, f: FileEntry, chunk_bytes: int, n: Tree, owner: pwd.struct_passwd | None) -> bool:
        """Make ``f.path`` in ``n`` a hard link to the staged file that holds exactly ``f``'s chunks at
        their places and nothing else (a chunk staged whole, or a part file the puts filled:
        :func:`hfai.storage.staging.write_put`), if there is one: the file is then never copied.
        Its mode and owner are set through its descriptor before it is linked (in staging, no
        job can reach it). False (nothing done) otherwise."""
        if self._locate is None or not f.chunks:
            return False
        first = self._locate(f.chunks[0])
        if first is None or not is_whole(first.path) or first.path in self._linked:
            return False
        for i, h in enumerate(f.chunks):
            where = first if i == 0 else self._locate(h)
            if where is None or where.path != first.path or where.offset != i * chunk_bytes:
                return False
        try:
            src = os.open(first.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:  # released meanwhile by another commit: copy from elsewhere
            return False
        try:
            st = os.fstat(src)
            if st.st_nlink != 1 or st.st_size != f.size:  # already some workspace's file (see put)
                return False
            os.fchmod(src, f.mode & 0o777)
            fchown(src, owner)
            dir_fd, name = n.parent(f.path)
            os.link(first.path, name, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:  # released meanwhile by another commit: copy from elsewhere
            return False
        finally:
            os.close(src)
        self._linked.add(first.path)
        return True

    def put(self, h: str, out: int, at: int) -> bool:
        """Write chunk ``h`` into the file ``out`` at offset ``at``; False if it is not staged."""
        where = self._locate(h) if self._locate is not None else None
        if where is not None:
            try:
                src = self._fds.get(where.path)
                if src is None:
                    src = self._fds[where.path] = os.open(where.path, os.O_RDONLY)
                    if is_whole(where.path) and where.path not in self._linked and os.fstat(src).st_nlink != 1:
                        # Linked into a workspace by a commit whose release has not happened yet:
                        # a job there may already have rewritten it, so its bytes are not the chunk.
                        os.close(self._fds.pop(where.path))
                        return self._bytes(h, out, at)
                _copy_range(src, where.offset, out, at, where.length)
                return True
            except FileNotFoundError:  # released meanwhile by another commit: try the bytes
                pass
            except OSError as e:
                if e.errno not in _NO_COPY_RANGE:
                    raise
                self._locate = None  # this filesystem cannot: read and write from now on
        return self._bytes(h, out, at)

    def _bytes(self, h: str, out: int, at: int) -> bool:
        try:
            data = self._read(h)
        except KeyError:
            return False
        os.pwrite(out, data, at)
        return True

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()


#: copy_file_range refused by the kernel or filesystem (old kernels, some network filesystems).
_NO_COPY_RANGE = {errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}


def _copy_range(src: int, src_at: int, out: int, out_at: int, length: int) -> None:
    while length > 0:
        n = os.copy_file_range(src, out, length, src_at, out_at)
        if n == 0:
            raise OSError(f"staged chunk ends early ({length} bytes short)")
        src_at, out_at, length = src_at + n, out_at + n, length - n


def _build(base: Path, nxt: Path, new: Manifest, todo: rules.CommitPlan, held: dict[str, tuple[str, int]],
           staged: _Source, owner: pwd.struct_passwd | None) -> tuple[str, ...]:
    """Assemble N; returns the temporary files of an earlier, killed commit found in D (the apply
    step removes them). D and N are both the user's (a job can change them meanwhile): every path
    in them is resolved through a :class:`~hfai.storage.beneath.Tree`, never following a symlink."""
    nxt.mkdir(mode=0o700)
    has_old = base.is_dir()
    # Descriptors and relative string paths: per file, Path objects and the resolution of the
    # whole absolute path cost several times the link itself.
    with contextlib.ExitStack() as held_open:
        held_open.callback(staged.close)
        n = held_open.enter_context(Tree.of(nxt))
        d = held_open.enter_context(Tree.of(base)) if has_old else None
        if d is not None:
            os.fchmod(n.top, stat.S_IMODE(os.fstat(d.top).st_mode))
        fchown(n.top, owner)
        rewrite = {f.path for f in todo.write}
        copy = {f.path for f in todo.chmod}
        changed: set[str] = set()  # D's files found not to hold what their manifest says
        complete = True
        made: set[str] = set()  # N's directories made so far: every directory of the new manifest
        for f in new.files:
            complete &= _place(d, n, f, new.chunk_bytes, held, staged, owner, rewrite, copy, changed, made)
        if not complete:
            raise _Changed(sorted(changed))
        return _link_others(d, n, new, set(todo.delete), owner, made) if d is not None else ()


#: What resolving a path of D can meet when a job changed it since the plan: the file is gone, or
#: a symlink or a file stands where a directory was (never followed: the file counts as changed).
_GONE = {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EINVAL}


def _place(d: Tree | None, n: Tree, f: FileEntry, chunk_bytes: int, held: dict[str, tuple[str, int]],
           staged: _Source, owner: pwd.struct_passwd | None, rewrite: set[str], copy: set[str],
           changed: set[str], made: set[str]) -> bool:
    """Put one file of the new manifest into N: assembled, copied (a mode change) or linked.
    False (``f.path`` added to ``changed``) when D's file is not what the plan found."""
    path = f.path
    parent = path.rpartition("/")[0]
    if parent and parent not in made:
        make_new_parents_at(n, parent, owner, made)
    if path in rewrite or d is None:
        return _assemble(d, n, f, chunk_bytes, held, staged, owner, changed)
    if path in copy:  # same content, other mode: a copy, so the old tree keeps its mode
        return _copy_checked(d, n, f, chunk_bytes, owner, changed)
    try:
        src_fd, name = d.parent(path)
        os.link(name, name, src_dir_fd=src_fd, dst_dir_fd=n.dir(parent), follow_symlinks=False)
    except OSError as e:
        if e.errno not in _GONE:
            raise
        changed.add(path)
        return False
    return True


def _create(n: Tree, f: FileEntry, owner: pwd.struct_passwd | None) -> int:
    """A new file at ``f.path`` in N, with ``f``'s mode and ``owner`` set through its descriptor."""
    fd = n.open(f.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, f.mode & 0o777)
        fchown(fd, owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _copy_checked(d: Tree, n: Tree, f: FileEntry, chunk_bytes: int, owner: pwd.struct_passwd | None,
                  changed: set[str]) -> bool:
    """Copy D's ``f.path`` to N with ``f``'s mode, each chunk checked against ``f``'s hashes: a job
    may have made it a hard link to a file outside the workspace, and only bytes its user pushed
    are copied (docs/security.md). False (added to ``changed``) when they are not those."""
    try:
        src = d.open_regular(f.path)
    except OSError as e:
        if e.errno not in _GONE:
            raise
        changed.add(f.path)
        return False
    try:
        if os.fstat(src).st_size != f.size:
            changed.add(f.path)
            return False
        out = _create(n, f, owner)
        try:
            for i, h in enumerate(f.chunks):
                data = os.pread(src, chunk_bytes, i * chunk_bytes)
                if not chunk_matches(h, data):
                    changed.add(f.path)
                    return False
                os.pwrite(out, data, i * chunk_bytes)
        finally:
            os.close(out)
    finally:
        os.close(src)
    return True


class _Changed(Conflict):
    def __init__(self, paths: list[str]):
        self.paths = tuple(paths)
        if not paths:  # a chunk vanished from staging meanwhile (another push of the same content?)
            super().__init__("some chunks of this push are no longer on the cluster; push again")
            return
        super().__init__(f"{len(paths)} file(s) changed on the cluster since they were pushed ({paths[0]}"
                         f"{', …' if len(paths) > 1 else ''}); the next push sends their content again: push again")


def _assemble(d: Tree | None, n: Tree, f: FileEntry, chunk_bytes: int, held: dict[str, tuple[str, int]],
              staged: _Source, owner: pwd.struct_passwd | None, changed: set[str]) -> bool:
    """Write ``f`` at its path in N from chunks held in D's files (checked) or staged. False when
    a chunk is in neither (a file of D changed since its push, added to ``changed``, and nothing
    staged has that chunk)."""
    if staged.link(f, chunk_bytes, n, owner):
        return True
    fd = _create(n, f, owner)
    try:
        for i, h in enumerate(f.chunks):
            data = _held(d, held, h, chunk_bytes, changed) if d is not None else None
            if data is not None:
                os.pwrite(fd, data, i * chunk_bytes)
            elif not staged.put(h, fd, i * chunk_bytes):
                return False
    finally:
        os.close(fd)
    return True


def _held(d: Tree, held: dict[str, tuple[str, int]], h: str, chunk_bytes: int, changed: set[str]) -> bytes | None:
    if h not in held:
        return None
    path, offset = held[h]
    try:
        src = d.open_regular(path)
        try:
            data = os.pread(src, chunk_bytes, offset)
        finally:
            os.close(src)
    except OSError:
        data = b""
    if chunk_matches(h, data):
        return data
    changed.add(path)
    return None


def _link_others(d: Tree, n: Tree, new: Manifest, delete: set[str], owner: pwd.struct_passwd | None,
                 made: set[str]) -> tuple[str, ...]:
    """Hard-link into N what D holds besides the manifests' files: what jobs wrote there stays in
    the workspace across pushes. Entries the new manifest needs the place of lose (as an in-place
    commit would remove them). ``made``: N's directories, which are the new manifest's. D is
    walked by descriptors (``os.fwalk``), and each entry linked from its directory's."""
    files = {f.path for f in new.files}
    manifest_dirs = set(made)
    stray: list[str] = []
    for dirpath, subdirs, names, dir_fd in os.fwalk(".", dir_fd=d.top):
        rel_dir = "" if dirpath == "." else dirpath[2:]
        if rel_dir in files:  # a directory where the new manifest has a file
            subdirs[:] = []
            continue
        for entry in names + [s for s in subdirs if _is_link_at(dir_fd, s)]:
            rel = f"{rel_dir}/{entry}" if rel_dir else entry
            if entry.endswith(TMP_SUFFIX):
                stray.append(rel)
            elif rel not in files and rel not in delete and rel not in manifest_dirs and not _parents(rel) & files:
                if rel_dir and rel_dir not in made:
                    make_new_parents_at(n, rel_dir, owner, made)
                try:
                    os.link(entry, entry, src_dir_fd=dir_fd, dst_dir_fd=n.dir(rel_dir), follow_symlinks=False)
                except FileNotFoundError:
                    pass  # removed by a job since the listing: nothing to keep
    return tuple(stray)


def _is_link_at(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
    except FileNotFoundError:
        return False


def _parents(rel: str) -> set[str]:
    parts = rel.split("/")
    return {"/".join(parts[:i]) for i in range(1, len(parts))}


# ----------------------------------------------------------------------------------- apply

def _apply(d: Path, n: Path, paths: Iterable[str], delete: tuple[str, ...], owner: pwd.struct_passwd | None) -> None:
    """Make D's files ``paths`` N's (same inodes), remove ``delete`` from D. Idempotent. A commit
    passes the files it wrote or copied into N (each other file of N is D's, linked); recovery
    passes every file of the manifest (the ones already D's cost an lstat each). Jobs run in D:
    its paths are resolved without following a symlink (a removed file's directory may be one
    by now, to another user's workspace)."""
    with Tree.of(d) as dt, Tree.of(n) as nt:
        checked: set[str] = set()  # D's directories made or checked in this pass
        for path in paths:
            parent, _, name = path.rpartition("/")
            if parent:
                make_parents_at(dt, parent, owner, checked)
            _apply_one(dt, nt, path, parent, name)
        for rel in delete:
            try:
                fd, name = dt.parent(rel)
                os.unlink(name, dir_fd=fd)
            except OSError as e:
                if e.errno not in _GONE | {errno.EISDIR}:
                    raise  # else not there as a file (of D's own directories): nothing to delete
    prune_empty_dirs(d)


def _apply_one(dt: Tree, nt: Tree, path: str, parent: str, name: str) -> None:
    src = ino_at(nt, path)
    dfd = dt.dir(parent)
    try:
        st = os.lstat(name, dir_fd=dfd)
    except FileNotFoundError:
        st = None
    if st is not None and st.st_ino == src != 0:
        return
    if st is not None and stat.S_ISDIR(st.st_mode):
        remove_at(dfd, name)
        dt.forget(path)
    tmp = f".{name}{TMP_SUFFIX}"
    try:
        os.unlink(tmp, dir_fd=dfd)
    except FileNotFoundError:
        pass  # the usual case: no earlier, killed try of this file
    os.link(name, tmp, src_dir_fd=nt.dir(parent), dst_dir_fd=dfd, follow_symlinks=False)
    os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)


# --------------------------------------------------------------------------------- recover

def recover(ws: Workspaces, user: str, journal: CommitJournal) -> str:
    """Finish or undo the commit ``journal`` records (the service was killed during it); returns
    what was done ("finished" or "undone")."""
    base = ws.path(user, journal.workspace)
    nxt = next_path(base)
    at_path = ino(base)
    owner = ws.user_dir(user)
    phase = Phase(journal.phase)
    packed: bytes | None = None
    if at_path == 0 or at_path not in (journal.old_ino, journal.new_ino):
        done = "undone"  # the workspace is gone or replaced: nothing of this commit applies
    elif journal.old_ino == 0 or (at_path == journal.old_ino and phase is Phase.APPLIED):
        done = "finished"
    elif at_path == journal.new_ino:  # swapped: D waits at the side name
        # Which files the killed commit had left to apply is not recorded: all are looked at.
        packed = pack(journal.manifest)
        _apply_and_return(ws, user, base, journal, packed, _paths(journal.manifest), owner, swapped=True)
        done = "finished"
    elif phase is Phase.APPLYING:  # the in-place fallback, killed while applying
        _apply(base, nxt, _paths(journal.manifest), journal.delete, owner)
        done = "finished"
    else:  # BUILT and never swapped: D is the old tree, exactly
        done = "undone"
    if done == "finished":
        _finish(ws, user, journal, packed if packed is not None else pack(journal.manifest))
    else:
        remove_tree(nxt)
        ws.drop_journal(user, journal.workspace)
    log.warning("%s/%s: a commit the service was killed in is %s", user, journal.workspace, done)
    return done


def _paths(m: Manifest) -> tuple[str, ...]:
    return tuple(f.path for f in m.files)


def clean_temporaries(base: Path) -> int:
    """Remove temporary files of killed commits inside a workspace; returns how many. Walked by
    descriptors: each is unlinked from its own directory, never through a symlink."""
    n = 0
    try:
        top = Tree.of(base)
    except FileNotFoundError:
        return 0
    with top:
        for _dirpath, _dirs, names, dir_fd in os.fwalk(".", dir_fd=top.top):
            for entry in names:
                if entry.endswith(TMP_SUFFIX):
                    try:
                        os.unlink(entry, dir_fd=dir_fd)
                        n += 1
                    except FileNotFoundError:
                        pass  # removed meanwhile: what this sweep was for
    return n
