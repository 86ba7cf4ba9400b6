"""Run-directory files that need not survive a power loss: written atomically, never fsynced.

An fsync costs milliseconds on a busy or virtual disk (1-7 ms, median, on the 3-node bench), and
the agent's event loop and each launcher used to pay seven per run (assignment, launch spec,
launcher pid, job pid, exit status, two ``.sent`` markers), all on the run's path. What each buys:

* A crash of the agent process loses nothing either way: written data is in the page cache.
* After a power loss (or a kernel crash) every run of the node is dead, so a file whose only
  reader runs in the same boot needs no fsync: ``launch`` (read by the launcher as it starts),
  ``launcher_pid`` and ``child_pid`` (a pid means nothing after a reboot; a missing one reads as
  "launcher gone", which is true then).
* ``<event>.sent`` markers are empty: their existence is the whole content. One lost to a power
  loss only makes the agent report that event again, which the leader ignores (events carry a
  ``Nats-Msg-Id`` and applying one twice changes nothing).

What reaches the disk later, off the run's path: ``assignment`` and ``exit_code``, which the
agent reads back after a reboot, are fsynced by a child of the launcher once the job is over
(launcher.py), while the agent already reports the exit; a long run's assignment is written back
by the kernel meanwhile. A crash of the host before that leaves either file whole or missing (or
empty), never torn. A missing exit status reads as a run killed with its node; the window in which
a crash loses one is the few milliseconds of that fsync, as when the launcher fsynced before it
exited, and the agent reports the status in those same milliseconds. A run directory whose
assignment is unreadable is recorded as a killed run when the plan asks for it again
(RunStore.start), where the agent once retried the start forever. Fsynced before the
rename as before (:func:`hfai._atomic.write_atomic`), off the hot path: ``term`` and ``fenced``
(whether the platform stopped the run), failed starts, and the agent's ``fence``.

Atomic all the same: a reader (the agent's snapshot, a launcher) sees the old file or the new one,
never half of one.
"""

from __future__ import annotations

import os


def write_volatile(path: str | os.PathLike, data: bytes | str) -> None:
    """Replace ``path`` with ``data`` atomically (temp file, rename), without an fsync."""
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        with open(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except BaseException:
        try:  # leave no temp file behind
            os.unlink(tmp)
        except OSError:
            pass
        raise


def touch(path: str | os.PathLike) -> None:
    """Create the empty marker file ``path`` (nothing to tear: it exists or it does not)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666))
