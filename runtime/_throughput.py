"""A job's throughput, measured with no change to its code, for the scheduler's elastic sizing.

hfai scripts already mark their steps: they call :func:`hfai.receive_suspend_command` (or
``model.try_save``) once per step, or draw their batches from an :mod:`hfai.data` loader. Each
such call counts one step here; a process counts the kind of call it made first only, so a
script that both iterates a loader and asks for the suspend flag counts each step once. A script
that would rather count samples or tokens calls :func:`report_throughput` with how many it just
processed: from then on only its reports count.

Every ``HFAI_THROUGHPUT_INTERVAL_S`` seconds (20 by default, at least 1) the process writes the
rate of the window that just ended into its run's control directory (:data:`THROUGHPUT_FILE`, one
JSON line, replaced atomically); the agent relays it to the controller at most every ``[agent]
throughput_relay_s``. Each process of a node writes the same file: data-parallel ranks step
together, so whichever wrote last says the same. Off the platform (no control directory)
nothing is counted.

The first marked step starts the first window: importing, loading data and restoring a
checkpoint are not steps. How long they took (from the start of the job's session, the run's
first process, to its first step) is written beside the rate as ``startup_s``, the restart cost
the scheduler weighs a resize against.

When the process exits normally (the script returned, or called ``sys.exit``: how a job ends,
and how it leaves after a suspend's checkpoint) the window under way is written too, however
short: a job resized every few minutes would otherwise lose up to a whole interval of each run
at each size, and a job shorter than an interval would be measured not at all.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import time
from collections.abc import Callable

#: In the run's control directory: the last window's rate, as the agent reads it.
THROUGHPUT_FILE = "throughput"
INTERVAL_ENV = "HFAI_THROUGHPUT_INTERVAL_S"
DEFAULT_INTERVAL_S = 20.0
MIN_INTERVAL_S = 1.0
#: Units a report may name (the controller keeps one unit per job: only ratios matter).
UNITS = ("steps", "samples", "tokens")


def _interval_s() -> float:
    try:
        value = float(os.environ.get(INTERVAL_ENV, DEFAULT_INTERVAL_S))
    except ValueError:
        return DEFAULT_INTERVAL_S
    return max(MIN_INTERVAL_S, value) if math.isfinite(value) else DEFAULT_INTERVAL_S


def _session_age_s() -> float | None:
    """Seconds since this job's session leader (the run's first process: spawned ranks come
    later) started, on the boot clock; None where /proc does not say."""
    try:
        with open(f"/proc/{os.getsid(0)}/stat", "rb") as f:
            # Field 22 (starttime, clock ticks after boot); the command name may hold spaces.
            start_ticks = int(f.read().rsplit(b")", 1)[1].split()[19])
        return time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


class Meter:
    """Counts one process's steps (or reported units) and writes a window's rate when it ends."""

    def __init__(self, control_dir: str, interval_s: float, clock: Callable[[], float] = time.monotonic):
        self.control_dir = control_dir
        self.interval_s = interval_s
        self.clock = clock
        self.source = ""  # the kind of call that counts ("suspend", "save", "loader", "report")
        self.unit = "steps"
        self.start: float | None = None  # the current window's start
        self.count = 0.0
        self.seq = 0
        self.startup_s: float | None = None

    def mark(self, source: str, n: float = 1.0, unit: str = "steps") -> None:
        if source != self.source:
            if self.source == "report" or (self.source and source != "report"):
                return  # another kind of call counts in this process
            self.source, self.unit, self.start, self.count = source, unit, None, 0.0
        now = self.clock()
        if self.start is None:
            # The first mark opens the window: what it counts was done before any start we know.
            self.start = now
            if self.startup_s is None:
                self.startup_s = _session_age_s() or 0.0
            return
        self.count += n
        if now - self.start >= self.interval_s:
            self.flush(now)

    def close(self) -> None:
        """Write the window under way, if it counted anything (at the process's exit)."""
        if self.start is not None and self.count > 0:
            self.flush(self.clock())

    def flush(self, now: float) -> None:
        seconds = now - self.start if self.start is not None else 0.0
        if seconds <= 0:
            return
        self.seq += 1
        line = {"seq": self.seq, "pid": os.getpid(), "rate": self.count / seconds, "seconds": seconds,
                "unit": self.unit, "startup_s": self.startup_s or 0.0}
        self.start, self.count = now, 0.0
        from hfai._atomic import write_atomic

        try:
            write_atomic(os.path.join(self.control_dir, THROUGHPUT_FILE), json.dumps(line) + "\n")
        except OSError:
            pass  # the training goes on; the next window tries again


#: This process's meter (None off the platform), made at the first step marked.
_meter: Meter | None = None
_made = False


def _get() -> Meter | None:
    global _meter, _made
    if not _made:
        cdir = os.environ.get("HFAI_CONTROL_DIR")
        _meter, _made = (Meter(cdir, _interval_s()) if cdir else None), True
        if _meter is not None:
            atexit.register(_meter.close)
    return _meter


def mark_step(source: str) -> None:
    """One step of the job, marked by a call of the kind ``source`` (cheap: a clock read)."""
    meter = _meter if _made else _get()
    if meter is not None:
        meter.mark(source)


def report_throughput(n: float, unit: str = "samples") -> None:
    """Count ``n`` more ``unit`` ("samples", "tokens" or "steps") processed since the last call.

    Call it once per step with what the step processed (on each rank, or on rank 0 only: the
    scheduler compares this job's rates at different sizes, so only the ratios count). From the
    first call on, the process's own steps no longer count. Off the platform it only checks its
    arguments."""
    if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n < 0:
        raise TypeError(f"report_throughput(n, ...) takes a number >= 0 of {unit}, got {n!r}")
    if unit not in UNITS:
        raise ValueError(f"report_throughput(..., unit=...) takes one of {', '.join(UNITS)}, got {unit!r}")
    meter = _get()
    if meter is not None:
        meter.mark("report", float(n), unit)

