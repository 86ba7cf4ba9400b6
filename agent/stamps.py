"""When the agent did something to a run (raised its suspend flag, sent its SIGTERM, first saw its
acknowledgement), as files of the run's directory that the interrupt windows are measured from.

A stamp is one line, ``"<wall> <boottime>"``: the wall time for people, the boot clock
(:meth:`hfai.core.clock.Clock.boottime`) for deadlines. The boot clock is the same in every process of
a boot and is never stepped, so an agent restarted mid-window, or a wall clock stepped by NTP or by
hand, neither stretches nor cuts a window (a clock stepped back by minutes would keep a job that
never acknowledges alive long past its SIGTERM's window; stepped forward, it would cut a
checkpoint off).

Stamps live in ``runs/<key>/``, the agent's alone: nothing a job can write (its control directory,
the times of its files) moves a deadline. Where a stamp could not be written (a full disk) only a
wall time is there, the suspend flag's own mtime: :func:`read` turns it into the boot clock at the
offset the two clocks have now, never later than now, and writes the result down, so it is
converted once and a later step of the wall clock does not move it.
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

from hfai.agent.statefile import write_state
from hfai.core.clock import Clock

log = logging.getLogger(__name__)

# In runs/<key>/ beside ``term`` (the SIGTERM's stamp).
SUSPEND_STAMP = "suspend_raised"  # the agent raised the suspend flag
ACK_STAMP = "ack_seen"  # the agent first saw the job's acknowledgement


def stamp(clock: Clock) -> str:
    """A stamp of now, as :func:`read` reads it back."""
    return _text(clock.time(), clock.boottime())


def _text(wall: float, boot: float) -> str:
    return f"{wall!r} {boot!r}\n"


def parse(text: str | None) -> tuple[float | None, float | None]:
    """(wall, boottime) of a stamp's text; (None, None) for text that is not a stamp."""
    parts = (text or "").split()
    try:
        values = [float(p) for p in parts[:2]]
    except ValueError:
        return None, None
    if len(values) < 2 or not all(math.isfinite(v) for v in values):
        return None, None
    return values[0], values[1]


def from_wall(wall: float, clock: Clock) -> float:
    """A wall time as the boot clock, at the offset the two have now; never later than now (a
    wall time ahead, a job's file dated in the future, starts its window now, not never)."""
    now = clock.boottime()
    return min(now, now - (clock.time() - wall))


def read(path: Path, clock: Clock, fallback_wall: float | None = None) -> float | None:
    """The boot time stamped in ``path``, never later than now. Without a stamp, ``fallback_wall``
    (the wall time of what the stamp would have dated, when the stamp could not be written) is
    converted by :func:`from_wall` and written to ``path`` (best effort: on a full disk it is
    converted again next time). None: nothing was stamped."""
    _wall, boot = parse(_read_text(path))
    if boot is not None:
        return min(boot, clock.boottime())
    wall = fallback_wall
    if wall is None:
        return None
    boot = from_wall(wall, clock)
    try:
        write_state(path, _text(wall, boot))
    except OSError as e:  # each load converts it again meanwhile: no warning every tick on a full disk
        log.debug("could not record the boot-clock stamp %s: %s", path, e)
    return boot


def write_once(path: Path, clock: Clock) -> float:
    """The boot time stamped in ``path``, stamping now first if nothing is (the first sight of
    something the agent does not itself do, a job's acknowledgement). Raises OSError if it cannot
    be written."""
    boot = read(path, clock)
    if boot is not None:
        return boot
    boot = clock.boottime()
    write_state(path, _text(clock.time(), boot))
    return boot


def _read_text(path: Path) -> str | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 256).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)
