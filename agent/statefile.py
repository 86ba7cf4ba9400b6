"""Run-directory files that need not survive a power loss: written atomically, never fsynced.

An fsync costs milliseconds on a busy or virtual disk (docs/performance.md), and a run writes
seven files (assignment, launch spec, launcher pid, job pid, exit status, two ``.sent`` markers),
all on its path through the agent's event loop and its launcher. What each fsync buys:

* A crash of the agent process loses nothing either way: written data is in the page cache.
* After a power loss (or a kernel crash) every run of the node is dead, so a file whose only
  reader runs in the same boot needs no fsync: ``launch`` (read by the launcher as it starts),
  ``launcher_pid`` and ``child_pid`` (a pid means nothing after a reboot; a missing one reads as
  "launcher gone", which is true then).
* ``<event>.sent`` markers are empty: their existence is the whole content. One lost to a power
  loss only makes the agent report that event again, which the leader ignores (events carry a
  ``Nats-Msg-Id`` and applying one twice changes nothing).

What reaches the disk later, off the run's path: ``assignment`` and ``exit_code``, which the
agent reads back after a reboot, are fsynced once the job is over by the zygote that forked the
launcher (a thread of it), else by a child of the launcher (launcher.py), while the agent already
reports the exit; a long run's assignment is written back
by the kernel meanwhile. A crash of the host before that leaves either file whole or missing (or
empty), never torn. A missing exit status reads as a run killed with its node; the window in which
a crash loses one is the few milliseconds of that fsync, and the agent reports the status in those
same milliseconds. A run directory whose assignment is unreadable is recorded as a killed run when
the plan asks for it again (RunStore.start), rather than started again. Fsynced before the
rename (:func:`hfai._atomic.write_atomic`), off the hot path: ``term`` and ``fenced``
(whether the platform stopped the run), failed starts, and the agent's ``fence``.

Atomic all the same: a reader (the agent's snapshot, a launcher) sees the old file or the new one,
never half of one.
"""

from __future__ import annotations

import errno
import os

from hfai._atomic import write_atomic


class LocalStateError(RuntimeError):
    """The agent cannot write its own state on this node: waiting does not cure that, so the
    task that met it ends and the agent stops (see :class:`hfai.core.daemon.Supervisor`)."""


def write_volatile(path: str | os.PathLike, data: bytes | str, pool: str = "") -> None:
    """Replace ``path`` with ``data`` atomically (temp file, rename), without an fsync; the temp
    file a blank of ``pool`` where its folder has one (see below)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    recycled = bool(pool) and take_blank(path, tmp, pool)
    try:
        # A blank is overwritten, then cut to the new length: emptied first, it would give its
        # blocks back (a discard, on a disk mounted so) only to take them again.
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | (0 if recycled else os.O_TRUNC),
                     0o666)
        with open(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            if recycled:
                f.truncate()
        os.replace(tmp, path)
    except BaseException:
        try:  # leave no temp file behind
            os.unlink(tmp)
        except OSError:
            pass
        raise


def touch(path: str | os.PathLike, pool: str = "") -> None:
    """Create the marker file ``path`` (nothing to tear: it exists or it does not), empty; or a
    blank of ``pool`` renamed there, where its folder has one (see below): a marker's existence is
    all it says, so the blank's old bytes stay (emptying it would give its block back)."""
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    if pool and take_blank(path, tmp, pool):
        try:
            os.replace(tmp, path)
            return
        except OSError:
            try:
                os.unlink(tmp)
            except OSError:
                pass
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))


# ------------------------------------------------------------------------------ recycled files
#
# Where making a file costs far more than renaming one (a filesystem that looks long for a free
# inode: ext4 without a journal steps over every inode freed in the last minute, hundreds of
# microseconds of CPU per new file at a few dozen runs a second: docs/performance.md), a run
# directory kept as a spare for the next run (RunStore.empty_trash) keeps its old run's files as
# blanks: ``blank.<pool><i>``. A writer given a pool takes one (a rename) as its temp file instead
# of making one; the temp file is truncated and written whole before its rename into place, so a
# reader sees what a new file would have shown. One pool per writer (the agent's, the launcher's),
# as both write in a run directory at once: a blank that the other took fails the rename
# (ENOENT), and the next one is tried.

BLANK_PREFIX = "blank."
# The agent's writes (assignment, launch, launcher_pid, two .sent) and the launcher's (child_pid,
# exit_code, usage).
BLANKS = {"a": 5, "l": 3}


def blank_names() -> list[str]:
    """Every blank's name, in the order a spare directory is filled with them."""
    return [f"{BLANK_PREFIX}{pool}{i}" for pool, n in BLANKS.items() for i in range(n)]


def take_blank(path: str, tmp: str, pool: str) -> bool:
    """Rename a blank of ``pool`` in ``path``'s folder to ``tmp``; False if there is none."""
    folder = os.path.dirname(path)
    for i in range(BLANKS.get(pool, 0)):
        try:
            os.rename(os.path.join(folder, f"{BLANK_PREFIX}{pool}{i}"), tmp)
            return True
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return False


# ------------------------------------------------------------------------------- a full disk
#
# On a full filesystem a new file can still be created on most (an inode, no data block), but not
# written: every write above (a temp file, then a rename) fails with ENOSPC. So the files a run
# must be able to write whatever the disk holds (the job's pid, its exit status, the fence and
# SIGTERM markers) get a reserve when the run starts: ``<name>.reserve``, RESERVE_BYTES of blanks
# already on the disk. A write that meets a full disk overwrites the reserve's bytes in place (no
# new block) and renames it over ``<name>``: atomic all the same, and the readers, which strip
# whitespace, read the same value.

RESERVE_SUFFIX = ".reserve"
RESERVE_BYTES = 64
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` is a filesystem out of space (or of the user's quota)."""
    return isinstance(e, OSError) and e.errno in DISK_FULL_ERRNOS


def make_reserve(path: str | os.PathLike) -> None:
    """Put ``path``'s reserve on the disk (see above); raises OSError (ENOSPC) if it cannot."""
    fd = os.open(f"{os.fspath(path)}{RESERVE_SUFFIX}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o600)
    try:
        _write_all(fd, b" " * (RESERVE_BYTES - 1) + b"\n")
    finally:
        os.close(fd)


def write_state(path: str | os.PathLike, data: bytes | str, durable: bool = False, pool: str = "") -> None:
    """Replace ``path`` with ``data`` (at most RESERVE_BYTES - 1 bytes) atomically, fsynced if
    ``durable``; on a full disk through ``path``'s reserve. Raises the disk's OSError when that
    fails too (no reserve, or it was used already). ``pool``: see write_volatile."""
    raw = data.encode() if isinstance(data, str) else data
    try:
        if durable:
            write_atomic(path, raw)
        else:
            write_volatile(path, raw, pool)
        return
    except OSError as e:
        if not disk_full(e):
            raise
        full = e
    if not _write_through_reserve(os.fspath(path), raw, durable):
        raise full


def _write_through_reserve(path: str, raw: bytes, durable: bool) -> bool:
    if len(raw) >= RESERVE_BYTES:
        return False
    try:
        fd = os.open(f"{path}{RESERVE_SUFFIX}", os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        # Same length as the reserve: the trailing blanks overwrite what it held, no block is added.
        os.pwrite(fd, raw.ljust(RESERVE_BYTES - 1) + b"\n", 0)
        if durable:
            os.fsync(fd)
    except OSError:
        return False
    finally:
        os.close(fd)
    os.replace(f"{path}{RESERVE_SUFFIX}", path)
    return True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
