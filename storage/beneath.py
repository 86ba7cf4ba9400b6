"""Paths inside a tree a job can write to, resolved without following a symlink on the way.

A job may replace any directory of its workspace (or of the tree a commit assembles beside it:
the user's too) by a symlink to anywhere, at any moment, and the service runs as root. An
``open``, ``stat``, ``link`` or copy of ``<tree>/a/b`` resolves ``a`` as the kernel finds it:
``O_NOFOLLOW`` and ``follow_symlinks=False`` guard only ``b``. So every path inside such a tree
goes through a :class:`Tree`: from a descriptor of the tree's top, each directory is opened with
``O_NOFOLLOW | O_DIRECTORY`` relative to its parent's descriptor, and the last component is
handed to an ``*at`` call with its parent's descriptor (symlinks not followed there either). A
symlink, or a file, anywhere on the way is an OSError (ELOOP or ENOTDIR), never followed. A
descriptor stays the directory it was opened as whatever is renamed later, so a symlink swapped in
between a check and a use changes nothing the service reads or writes.

A walk, not ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)``: it runs on every kernel, and with
the descriptors of recently used directories kept (files come in the manifest's order, a
directory's together) it costs one ``openat`` per directory, not per file.

What a hard link can do is a separate question, answered by the callers' rule (docs/security.md):
the bytes of a tree's file are copied elsewhere or sent to a client only after they are checked
against the chunk hashes its user pushed, and the service changes the mode or owner only of
files it made itself, through their own descriptors.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import OrderedDict

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Directories whose descriptors a tree keeps open at once (the least recently used is closed).
KEEP_DIRS = 64


def open_top(path: str | os.PathLike) -> int:
    """A descriptor of the directory ``path`` itself (not of what a symlink there points to).
    ``path``'s own parents are the service's (``<workspace_root>/<user>``), not a job's."""
    return os.open(path, _DIR_FLAGS)


def check_rel(rel: str) -> None:
    """Refuse a path that is not a plain relative one (what :func:`hfai.storage.rules.check_manifest`
    lets through never is refused; this is the second line, for paths from elsewhere)."""
    if not rel or rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in rel.split("/")):
        raise OSError(errno.EINVAL, "not a plain relative path inside the tree", rel)


class Tree:
    """A directory tree open by descriptor. Paths are ``/``-separated strings relative to its top
    ("" is the top). Descriptors it returns are its own: valid until :meth:`close` or until
    ``keep`` other directories have been asked for since; never close them."""

    def __init__(self, top_fd: int, keep: int = KEEP_DIRS):
        self.top = top_fd
        self._keep = max(keep, 2)  # a caller may hold two at once (a rename within a tree)
        self._dirs: OrderedDict[str, int] = OrderedDict()

    @classmethod
    def of(cls, path: str | os.PathLike, keep: int = KEEP_DIRS) -> Tree:
        return cls(open_top(path), keep)

    def __enter__(self) -> Tree:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every descriptor, the top's included. Safe to call twice."""
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()
        if self.top >= 0:
            os.close(self.top)
            self.top = -1

    def dir(self, rel_dir: str) -> int:
        """A descriptor of the directory ``rel_dir``, reached through directories only."""
        if not rel_dir:
            return self.top
        fd = self._dirs.get(rel_dir)
        if fd is not None:
            self._dirs.move_to_end(rel_dir)
            return fd
        parent, _, name = rel_dir.rpartition("/")
        if name in ("", ".", "..") or "\0" in name:
            raise OSError(errno.EINVAL, "not a plain relative path inside the tree", rel_dir)
        fd = os.open(name, _DIR_FLAGS, dir_fd=self.dir(parent))
        self._dirs[rel_dir] = fd
        while len(self._dirs) > self._keep:
            os.close(self._dirs.popitem(last=False)[1])
        return fd

    def parent(self, rel: str) -> tuple[int, str]:
        """(a descriptor of ``rel``'s directory, ``rel``'s last component), for an ``*at`` call."""
        check_rel(rel)
        parent, _, name = rel.rpartition("/")
        return self.dir(parent), name

    def lstat(self, rel: str) -> os.stat_result:
        """``rel`` itself (a symlink at its end is described, not followed)."""
        fd, name = self.parent(rel)
        return os.lstat(name, dir_fd=fd)

    def open(self, rel: str, flags: int, mode: int = 0o600) -> int:
        """Open ``rel`` (``O_NOFOLLOW`` added: a symlink there is ELOOP); the caller closes it."""
        fd, name = self.parent(rel)
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=fd)

    def open_regular(self, rel: str) -> int:
        """Open the regular file ``rel`` to read; OSError if it is anything else. Opened
        non-blocking, so a FIFO a job put there never blocks the open."""
        fd = self.open(rel, os.O_RDONLY | os.O_NONBLOCK)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file", rel)
            os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def forget(self, rel_dir: str) -> None:
        """Drop the descriptors of ``rel_dir`` and of what is below it: the caller removed or
        replaced that directory, and a later path through it must find what is there now."""
        below = rel_dir + "/"
        for key in [k for k in self._dirs if k == rel_dir or k.startswith(below)]:
            os.close(self._dirs.pop(key))

