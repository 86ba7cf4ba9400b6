"""File operations on directories a job can write to (its control directory), done by the agent.

The agent often runs as root and the job as its user, who can put anything in its control
directory: a symlink to /etc/shadow, a hard link to a root file, a FIFO that blocks a reader, a
file of endless size. So the agent never follows a link there (``O_NOFOLLOW``, ``lstat``), never
opens an existing file for writing (``O_EXCL``), never blocks on a special file (``O_NONBLOCK``),
reads only small regular files owned by the directory's owner, and reads at most a few bytes.
The directory itself sits in an agent-owned parent, so its path cannot be swapped.
"""

from __future__ import annotations

import errno
import os
import stat

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def lstat_mtime(directory: str | os.PathLike, name: str) -> float | None:
    """The modification time of whatever is at ``directory/name`` (links not followed)."""
    try:
        return os.lstat(os.path.join(directory, name)).st_mtime
    except (FileNotFoundError, NotADirectoryError):
        return None


def read_small(directory: str | os.PathLike, name: str, limit: int = 64) -> bytes | None:
    """Up to ``limit`` bytes of the regular file ``directory/name`` if the directory's owner owns
    it, else None (missing, a link, a FIFO, someone else's file)."""
    try:
        dfd = os.open(directory, _DIR_FLAGS)
    except OSError:
        return None
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
    except OSError:
        os.close(dfd)
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.fstat(dfd).st_uid:
            return None
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)
        os.close(dfd)


def create_flag(directory: str | os.PathLike, name: str, data: bytes) -> bool:
    """Create ``directory/name`` holding ``data``; False if something is already there (the
    job's own doing: nothing existing is ever opened for writing) or the directory is gone."""
    try:
        dfd = os.open(directory, _DIR_FLAGS)
    except OSError:
        return False
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
    except OSError:
        return False
    finally:
        os.close(dfd)
    try:
        os.write(fd, data)
    except OSError as e:
        # A full disk: the flag is there all the same (its existence and time are what count).
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
    finally:
        os.close(fd)
    return True


def open_log(path: str | os.PathLike, owner: tuple[int, int] | None) -> int:
    """Open (creating 0600) a job's log file for appending; its directory is agent-owned. With
    ``owner`` (uid, gid) the file is given to the job's user, who may then read it on the node."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file")
        os.fchmod(fd, 0o600)
        if owner is not None:
            os.fchown(fd, *owner)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_log_for_reading(path: str | os.PathLike) -> int:
    """Open a log file to serve a slice of it: never through a link, never a special file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FileNotFoundError(f"{path} is not a regular file")
    return fd


def private_dirs(base: str | os.PathLike, names: tuple[str, ...], owner: tuple[int, int] | None) -> None:
    """Make ``base/names[0]/names[1]/...`` (each missing one), every one of them 0700 and, with
    ``owner`` (uid, gid), that user's: a folder at a time from ``base`` (the agent's setting), never
    through a link. A job's user may have put a link where one of them goes: OSError (ELOOP or
    ENOTDIR), and nothing outside is chmod'ed or chown'ed."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in names:
            try:
                os.mkdir(name, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = sub
            os.fchmod(fd, 0o700)
            if owner is not None:
                os.fchown(fd, *owner)
    finally:
        os.close(fd)

