"""Relaying each run's measured throughput to the leader (docs/scheduling.md, "Elastic jobs").

A job's runtime writes the rate of its latest window into its control directory
(``hfai._throughput.THROUGHPUT_FILE``, one JSON line). The file is the job's: it is read through
:func:`hfai.agent.safefs.read_small` (bounded, no links, its owner's only) and every figure is
checked. The node of rank 0 relays a window it has not relayed yet, at most every
``[agent] throughput_relay_s`` per run, as a :class:`~hfai.protocol.types.RunThroughput`: a few
messages a minute however often the job writes. A run that exited has its file read once more,
whenever its last relay was: the job writes the window under way as it exits, and that window is
relayed before the run's exit report (agent/reconcile.py), while the leader still holds it
running (or suspending) at the size it was measured at.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

from hfai._throughput import THROUGHPUT_FILE, UNITS
from hfai.agent import safefs
from hfai.protocol.types import RunAssignment

#: The file is one short JSON line; anything longer is not the runtime's.
MAX_BYTES = 512
#: Figures past these are no measurement (a job's own file): a day's window, a day's startup.
MAX_SECONDS = 86400.0


@dataclass(frozen=True)
class Window:
    """One window's measurement, as the job wrote it."""

    rate: float
    seconds: float
    unit: str
    startup_s: float


def read_window(control_dir: str | os.PathLike) -> bytes | None:
    """The throughput file of a run's control directory, as :func:`parse` takes it."""
    return safefs.read_small(control_dir, THROUGHPUT_FILE, MAX_BYTES)


def parse(raw: bytes | None) -> Window | None:
    """The window in the file's bytes, or None where they are not one (missing, torn, forged)."""
    if not raw or len(raw) >= MAX_BYTES:
        return None
    try:
        d = json.loads(raw)
        rate, seconds, startup = float(d["rate"]), float(d["seconds"]), float(d.get("startup_s", 0.0))
        unit = d.get("unit", "steps")
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    if not all(math.isfinite(x) for x in (rate, seconds, startup)) or unit not in UNITS:
        return None
    if rate < 0 or not 0 < seconds <= MAX_SECONDS or not 0 <= startup <= MAX_SECONDS:
        return None
    return Window(rate, seconds, unit, startup)


class Relay:
    """Which runs' windows are due for relaying; what was relayed, per run (in memory: an agent
    restarted relays the current window again, which the leader's average barely notices)."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._last: dict[str, tuple[bytes, float]] = {}  # run key -> (file relayed, when: boot clock)

    def wants(self, ra: RunAssignment, now: float, final: bool = False) -> bool:
        """Whether ``ra``'s file is worth reading now (rank 0, its last relay an interval ago, or
        ``final``: the run exited, and its last window is relayed whenever the one before was)."""
        last = self._last.get(ra.key)
        return ra.rank == 0 and self.interval_s >= 0 and (final or last is None or now - last[1] >= self.interval_s)

    def due(self, ra: RunAssignment, raw: bytes | None, now: float, final: bool = False) -> Window | None:
        """The window to relay for ``ra`` now, or None. ``now``: the agent's boot clock."""
        if raw is None or not self.wants(ra, now, final):
            return None
        last = self._last.get(ra.key)
        if last is not None and last[0] == raw:
            return None
        window = parse(raw)
        if window is not None:
            self._last[ra.key] = (raw, now)
        return window

    def forget(self, alive: set[str]) -> None:
        """Drop what is known of runs no longer alive here."""
        for key in [k for k in self._last if k not in alive]:
            del self._last[key]


__all__ = ["MAX_BYTES", "THROUGHPUT_FILE", "Relay", "Window", "parse", "read_window"]
