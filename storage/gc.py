"""GC of workspaces (the I/O side of :func:`hfai.storage.rules.gc_moves` and ``gc_expired``).

Files untouched for ``gc_age_s`` move from ``<workspace_root>/<user>/<ws>/<rel>`` to
``<gc_root>/<user>/<stamp>/<ws>/<rel>`` (``stamp``: the epoch second of the move; the user can
fetch them back from there), and a stamp directory older than ``gc_keep_s`` is deleted. The time
is a parameter, so tests inject it instead of sleeping. A job may change its workspace while GC
looks at it: every path there is walked and moved through descriptors, never through a symlink
(:mod:`hfai.storage.beneath`).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from hfai.protocol import names
from hfai.storage import rules
from hfai.storage.beneath import Tree
from hfai.storage.files import remove_at
from hfai.storage.workspace import Workspaces

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcResult:
    moved: tuple[str, ...] = ()     # "<user>/<ws>/<rel>"
    deleted: tuple[str, ...] = ()   # "<user>/<stamp>"


def entries(ws: Path, depth: int = rules.GC_DEPTH) -> list[rules.Entry]:
    """What GC sees of one workspace: files at levels 1..depth, directories at level ``depth``
    with the newest mtime of anything in them. Walked by descriptors: a directory a job made a
    symlink meanwhile is not entered (links are not followed)."""
    out: list[rules.Entry] = []

    def visit(fd: int, prefix: str, level: int) -> None:
        with os.scandir(fd) as it:
            listed = [(e.name, e.stat(follow_symlinks=False)) for e in it]
        for name, st in listed:
            rel = f"{prefix}{name}"
            if not stat.S_ISDIR(st.st_mode):
                out.append(rules.Entry(rel, False, level, st.st_mtime))
                continue
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError:
                continue  # replaced or removed since it was listed: the next run sees what is there
            try:
                if level < depth:
                    visit(sub, f"{rel}/", level + 1)
                else:
                    out.append(rules.Entry(rel, True, level, newest_mtime(sub, st.st_mtime)))
            finally:
                os.close(sub)

    with Tree.of(ws) as tree:
        visit(tree.top, "", 1)
    return out


def newest_mtime(dir_fd: int, own: float) -> float:
    """The newest mtime of anything under the directory open at ``dir_fd`` (and ``own``)."""
    newest = own
    for _dirpath, dirs, files, fd in os.fwalk(".", dir_fd=dir_fd):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(name, dir_fd=fd).st_mtime)
            except OSError:
                pass  # gone since the walk listed it: it makes nothing newer
    return newest


def move_out(tree: Tree, rel: str, dest: Path) -> None:
    """Move ``rel`` of ``tree`` (a file, a link or a directory tree) to ``dest``, never through a
    symlink in ``tree``. To another filesystem it is copied through descriptors, then removed."""
    fd, name = tree.parent(rel)
    try:
        os.rename(name, dest, src_dir_fd=fd)
        return
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
    _copy_out(fd, name, dest)
    remove_at(fd, name)
    tree.forget(rel)


def _copy_out(dir_fd: int, name: str, dest: Path) -> None:
    st = os.lstat(name, dir_fd=dir_fd)
    if stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(name, dir_fd=dir_fd), dest)
    elif stat.S_ISDIR(st.st_mode):
        sub = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        try:
            dest.mkdir(mode=0o700)
            for entry in os.listdir(sub):
                _copy_out(sub, entry, dest / entry)
        finally:
            os.close(sub)
    elif stat.S_ISREG(st.st_mode):
        src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        try:
            with open(src, "rb", closefd=False) as f_in, open(dest, "xb") as f_out:
                shutil.copyfileobj(f_in, f_out)
            os.chmod(dest, stat.S_IMODE(st.st_mode) & 0o777)
            os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(src)
    # anything else (a FIFO, a device a job made) is not kept


def _move_all(ws: Path, rels: list[str], user_gc: Path, stamp: str) -> list[str]:
    """Move ``rels`` of the workspace ``ws`` under ``<user_gc>/<stamp>/<ws name>/``; those moved.
    One that cannot be (a job changed its path meanwhile, a symlink on the way) stays, logged."""
    done: list[str] = []
    if not rels:
        return done
    try:
        tree = Tree.of(ws)
    except OSError as e:
        log.warning("gc: could not open %s: %s", ws, e)
        return done
    with tree:
        for rel in rels:
            dest = user_gc / stamp / ws.name / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(user_gc, 0o700)
            try:
                move_out(tree, rel, dest)
            except OSError as e:
                log.warning("gc: left %s/%s where it is: %s", ws, rel, e)
                continue
            done.append(rel)
    return done


def run_gc(workspaces: Workspaces, gc_root: str | os.PathLike, now: float, age_s: float, keep_s: float) -> GcResult:
    gc = Path(gc_root)
    moved, deleted = [], []
    stamp = str(int(now))
    for user in workspaces.users():
        # Names starting with '.' are no workspaces (a commit's tree being assembled, for one).
        for ws in sorted(p for p in (workspaces.root / user).iterdir()
                         if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")):
            try:
                rels = rules.gc_moves(entries(ws), now, age_s)
            except OSError as e:  # replaced or removed meanwhile: the next run looks again
                log.warning("gc: could not look through %s: %s", ws, e)
                continue
            gone = _move_all(ws, rels, gc / user, stamp)
            moved += [f"{user}/{ws.name}/{rel}" for rel in gone]
            if gone:
                workspaces.forget(user, ws.name, gone)
        user_gc = gc / user
        if user_gc.is_dir() and names.is_token(user):
            for old in rules.gc_expired((p.name for p in user_gc.iterdir() if p.is_dir()), now, keep_s):
                shutil.rmtree(user_gc / old, ignore_errors=True)
                deleted.append(f"{user}/{old}")
    if moved or deleted:
        log.info("gc: moved %d path(s), deleted %d old gc entr(ies)", len(moved), len(deleted))
    return GcResult(tuple(moved), tuple(deleted))
