"""``hfai.set_watchdog_time(seconds)``: the original client's log watchdog, accepted as a no-op.

On Fire-Flyer a job that printed no log line for ``seconds`` (default 1800) was taken to have
hung and was failed. This platform has no log watchdog: a hung job runs until it ends or is
stopped (``hfai stop``). The call checks its argument and records it in
``HFAI_WATCHDOG_TIME`` (inherited by worker processes), so a script that sets it runs
unchanged and a later watchdog can read it.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)

ENV = "HFAI_WATCHDOG_TIME"


def set_watchdog_time(seconds: int) -> None:
    """Accept the original's watchdog timeout (an int of seconds > 0); nothing watches it here."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise TypeError(f"set_watchdog_time takes an int number of seconds, got {seconds!r}")
    if seconds <= 0:
        raise ValueError(f"set_watchdog_time takes a number of seconds > 0, got {seconds}")
    os.environ[ENV] = str(seconds)
    log.debug("set_watchdog_time(%d): recorded; this platform has no log watchdog", seconds)
