"""Small filesystem steps shared by workspace commits and GC: ownership, parents, pruning."""

from __future__ import annotations

import os
import pwd
import shutil
from pathlib import Path


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


def make_parents(base: Path, parent: Path, owner: pwd.struct_passwd | None, known: set[str] | None = None) -> None:
    """Create the directories between ``base`` and ``parent``; a non-directory in the way (a file
    the new manifest replaces by a directory) is removed. ``known``: directories this caller
    already made or checked (one commit step), not looked at again: a tree of 2,000 files in 100
    directories then costs 100 checks, not 4,000."""
    if known is not None and str(parent) in known:
        return
    cur = base
    for part in parent.relative_to(base).parts:
        cur = cur / part
        if known is not None and str(cur) in known:
            continue
        if cur.is_symlink() or (cur.exists() and not cur.is_dir()):
            cur.unlink()
        if not cur.exists():
            cur.mkdir()
            chown(cur, owner)
        if known is not None:
            known.add(str(cur))


def prune_empty_dirs(base: Path) -> None:
    for dirpath, dirs, files in os.walk(base, topdown=False):
        if dirpath != str(base) and not dirs and not files:
            try:
                os.rmdir(dirpath)
            except OSError:
                pass  # filled or removed meanwhile: then it is not an empty directory to prune


def remove_tree(path: Path) -> None:
    """Remove ``path`` whatever it is (a directory tree, a file, a link); absent is fine."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def ino(path: Path) -> int:
    """The inode number of ``path`` itself (0: nothing there)."""
    try:
        return os.lstat(path).st_ino
    except FileNotFoundError:
        return 0
