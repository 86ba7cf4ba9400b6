"""Is a process still running? The one test the agent (its launchers) and ``hfai local`` (its
daemons) share."""

from __future__ import annotations

import psutil

#: How far a process's creation time may be from the one recorded at its start and still be it
#: (psutil derives it from boot time and clock ticks: it can move by a fraction of a second).
CREATE_TIME_SLACK_S = 1.0


def pid_alive(pid: int | None, created: float | None = None) -> bool:
    """True if process ``pid`` exists and is not a zombie (exited, not yet reaped). With
    ``created`` (its ``psutil.Process.create_time()``, recorded when it was started), only if it
    is still that process: a pid the kernel gave to a later process is not it."""
    if not pid or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return created is None or abs(proc.create_time() - created) < CREATE_TIME_SLACK_S
    except psutil.Error:
        return False
