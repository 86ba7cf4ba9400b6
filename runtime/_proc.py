"""Is a process still running? The one test the agent (its launchers) and ``hfai local`` (its
daemons) share."""

from __future__ import annotations

import psutil

#: How far a process's creation time may be from the one recorded at its start and still be it
#: (psutil derives it from boot time and clock ticks: it can move by a fraction of a second).
CREATE_TIME_SLACK_S = 1.0


def pid_alive(pid: int | None, created: float | None = None, ticks: int | None = None) -> bool:
    """True if process ``pid`` exists and is not a zombie (exited, not yet reaped). With
    ``ticks`` (its :func:`start_ticks`) or else ``created`` (its ``psutil.Process.create_time()``),
    recorded when it was started, only if it is still that process: a pid the kernel gave to a
    later process is not it. ``ticks`` is exact and holds when the wall clock is stepped;
    ``created`` moves with every step (see :func:`start_ticks`)."""
    if not pid or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        if ticks is not None:
            return start_ticks(pid) == ticks
        return created is None or abs(proc.create_time() - created) < CREATE_TIME_SLACK_S
    except psutil.Error:
        return False


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat``, field 22):
    fixed for the process's life. ``psutil.Process.create_time()`` adds the boot time, which
    Linux derives from the wall clock (``btime``: now less the time since boot), so a wall clock
    stepped by more than a second made every recorded process look gone. None: no such process
    (or no /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        # Fields after the command name, which is in parentheses and may hold anything.
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None
