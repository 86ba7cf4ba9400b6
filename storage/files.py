"""Small filesystem steps shared by workspace commits and GC: ownership, parents, pruning, removal.

The ``*_at`` helpers take a :class:`~hfai.storage.beneath.Tree` (a directory a job can write to,
resolved without following a symlink) and a ``/``-separated path relative to it (plain strings):
a commit does one or two of these per file of a 10,000-file tree, and building a
:class:`~pathlib.Path` and resolving the whole absolute path again for each costed more than the
system calls themselves (a tree's hard links: 1.0-1.3 s by Path, 0.1-0.2 s by descriptor here).
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from pathlib import Path

from hfai.storage.beneath import Tree


def account(user: str) -> pwd.struct_passwd | None:
    """The Unix account to hand ``user``'s files to: only when the service runs as root and the
    node knows a non-root account of that name (None: keep the service's own)."""
    if os.geteuid() != 0:
        return None
    try:
        pw = pwd.getpwnam(user)
    except KeyError:
        return None
    return pw if pw.pw_uid != 0 else None


def chown(path: Path, owner: pwd.struct_passwd | None) -> None:
    if owner is not None:
        os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)


def open_dir(path: str | os.PathLike) -> int:
    """A descriptor of the directory ``path`` itself (not of what a symlink there points to)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def fchown(fd: int, owner: pwd.struct_passwd | None) -> None:
    """Hand the file open at ``fd`` (one the service made) to ``owner``: by its descriptor, so a
    name a job swapped meanwhile hands over nothing else."""
    if owner is not None:
        os.fchown(fd, owner.pw_uid, owner.pw_gid)


def make_parents_at(tree: Tree, rel_dir: str, owner: pwd.struct_passwd | None, known: set[str]) -> None:
    """Create the directory ``rel_dir`` (and those above it) in ``tree``; a non-directory in the
    way (a file the new manifest replaces by a directory, or a job's symlink) is removed.
    ``known``: directories this caller already made or checked (one commit step), not looked at
    again: a tree of 2,000 files in 100 directories then costs 100 checks, not 4,000."""
    if rel_dir in known:
        return
    cur = ""
    for part in rel_dir.split("/"):
        cur = f"{cur}/{part}" if cur else part
        if cur in known:
            continue
        fd, name = tree.parent(cur)
        try:
            st = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=fd)
            tree.forget(cur)
            st = None
        if st is None:
            _mkdir_at(tree, cur, owner)
        known.add(cur)


def make_new_parents_at(tree: Tree, rel_dir: str, owner: pwd.struct_passwd | None, made: set[str]) -> None:
    """Create ``rel_dir`` and the directories above it in ``tree``, which this caller made empty
    and alone fills (nothing of the caller's can be in the way: no check; a job's would make the
    mkdir or the walk fail); ``made`` holds those made so far."""
    if rel_dir in made:
        return
    parent = rel_dir.rpartition("/")[0]
    if parent:
        make_new_parents_at(tree, parent, owner, made)
    _mkdir_at(tree, rel_dir, owner)
    made.add(rel_dir)


def _mkdir_at(tree: Tree, rel: str, owner: pwd.struct_passwd | None) -> None:
    fd, name = tree.parent(rel)
    os.mkdir(name, dir_fd=fd)
    if owner is not None:
        os.chown(name, owner.pw_uid, owner.pw_gid, dir_fd=fd, follow_symlinks=False)


def ino_at(tree: Tree, rel: str) -> int:
    """The inode number of ``rel`` itself in ``tree`` (0: nothing there)."""
    try:
        return tree.lstat(rel).st_ino
    except FileNotFoundError:
        return 0


def remove_at(fd: int, name: str) -> None:
    """Remove the entry ``name`` of the directory open at ``fd``, whatever it is (a directory
    tree is emptied through descriptors, never following a symlink)."""
    if not _remove_subdir_at(fd, name):
        os.unlink(name, dir_fd=fd)


def prune_empty_dirs(base: Path) -> None:
    """Remove the directories under ``base`` found empty, through descriptors (a job may swap any
    of them for a symlink meanwhile: an rmdir by path would follow it)."""
    try:
        top = open_dir(base)
    except FileNotFoundError:
        return
    try:
        empty: set[str] = set()
        for dirpath, dirs, files, fd in os.fwalk(".", topdown=False, dir_fd=top):
            if dirpath != "." and not dirs and not files:
                empty.add(dirpath)
            for sub in dirs:
                if f"{dirpath}/{sub}" in empty:
                    try:
                        os.rmdir(sub, dir_fd=fd)
                    except OSError:
                        pass  # filled or removed meanwhile: then it is not an empty directory to prune
    finally:
        os.close(top)


def remove_tree(path: Path) -> None:
    """Remove ``path`` whatever it is (a directory tree, a file, a link); absent is fine. A tree is
    emptied through directory descriptors, names as listed (no stat of each file: a commit's side
    tree of 10,000 links went in half shutil.rmtree's time), never following a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    try:
        fd = open_dir(path)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        os.unlink(path)  # replaced by a symlink or a file meanwhile: that entry is what goes
        return
    try:
        _empty_dir_at(fd)
    finally:
        os.close(fd)
    os.rmdir(path)


def _empty_dir_at(fd: int) -> None:
    with os.scandir(fd) as it:
        entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in it]
    for name, is_dir in entries:
        if is_dir and _remove_subdir_at(fd, name):
            continue
        try:
            os.unlink(name, dir_fd=fd)
        except FileNotFoundError:
            pass  # removed meanwhile: what this was for


def _remove_subdir_at(fd: int, name: str) -> bool:
    """Empty and remove the directory ``name`` under ``fd``; False if it is no directory (any
    more: replaced by a link or a file meanwhile, which the caller then unlinks)."""
    try:
        sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except FileNotFoundError:
        return True
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        return False
    try:
        _empty_dir_at(sub)
    finally:
        os.close(sub)
    os.rmdir(name, dir_fd=fd)
    return True


def ino(path: Path) -> int:
    """The inode number of ``path`` itself (0: nothing there)."""
    try:
        return os.lstat(path).st_ino
    except FileNotFoundError:
        return 0
