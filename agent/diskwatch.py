"""Whether this node's state directory has room for the agent's work, and if not, why.

A full state directory must not kill the agent (ENOSPC writing its liveness stamp) nor record the
runs it cannot follow as killed: the agent degrades instead. While the
directory is full or nearly (``[agent] state_min_free_bytes``) it drains its own node, with the
reason in its heartbeat (``NodeRecord.drain_reason``, shown by ``hfai nodes``), so the leader
gives it no new work, and it takes work again by itself once space is back. Decided by
:func:`disk_verdict` (pure); :class:`DiskWatch` gathers what it needs.
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from hfai.agent.statefile import disk_full, write_volatile

log = logging.getLogger(__name__)

PROBE_FILE = ".space_probe"
PROBE_BYTES = 4096
# Space must come back to this many times the threshold before the node takes work again, so a
# log that grows and is trimmed around the threshold does not drain and undrain it every beat.
RESUME_FACTOR = 1.5


def disk_verdict(root: str, free: int, min_free: int, refused: str, draining: bool) -> str:
    """Pure: why the node must take no new work because of its state directory ``root``, or ''.

    ``free``: bytes free there for the agent; ``refused``: the error code of a write refused for
    space since the last verdict (or of the probe write), '' if none; ``draining``: whether the
    last verdict drained the node."""
    if refused:
        return f"state directory full: {root} ({refused})"
    if free < min_free or (draining and free < RESUME_FACTOR * min_free):
        return (f"state directory low on space: {root} ({_mib(free)} free, [agent] state_min_free_bytes "
                f"is {_mib(min_free)})")
    return ""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class DiskWatch:
    """The state directory's verdict, checked at each heartbeat (:meth:`check`), and every write
    the agent saw refused for space meanwhile (:meth:`saw`)."""

    def __init__(self, root: str | os.PathLike, min_free: int, drain_now: Callable[[], None] = lambda: None):
        self.root = Path(root)
        self.min_free = min_free
        self._drain_now = drain_now  # a heartbeat at once, to tell the leader
        self.reason = ""
        self._refused = ""  # the errno name of a write refused since the last check
        self.last_full: float | None = None  # time.time() a write was last refused for space here

    def full(self, e: OSError) -> bool:
        """Whether ``e`` is this node's disk full; if so the node drains itself at once (the
        leader hears it now, not a heartbeat later)."""
        if not self.saw(e):
            return False
        if not self.reason:
            self._drain_now()
        return True

    def saw(self, e: OSError) -> bool:
        """Note ``e`` if it is a full disk (True), so the next check drains the node."""
        if not disk_full(e):
            return False
        self._refused = errno.errorcode.get(e.errno or errno.ENOSPC, "ENOSPC")
        self.last_full = time.time()
        return True

    def check(self) -> str:
        """The verdict now (see disk_verdict); logs when it changes."""
        refused, self._refused = self._refused, ""
        free = self._free()
        if not refused and (self.reason or free < self.min_free):
            refused = self._probe()  # a drained node takes work again only if a write succeeds
        reason = disk_verdict(str(self.root), free, self.min_free, refused, bool(self.reason))
        if reason != self.reason:
            if reason:
                log.warning("draining this node: %s", reason)
            else:
                log.warning("the state directory %s has room again (%s free): taking work again",
                            self.root, _mib(free))
        self.reason = reason
        return reason

    def _free(self) -> int:
        try:
            st = os.statvfs(self.root)
        except OSError:
            return 0
        return st.f_bavail * st.f_frsize if st.f_favail else 0

    def _probe(self) -> str:
        path = self.root / PROBE_FILE
        try:
            write_volatile(path, b"\0" * PROBE_BYTES)
        except OSError as e:
            if self.saw(e):
                self._refused = ""
                return errno.errorcode.get(e.errno or errno.ENOSPC, "ENOSPC")
            raise
        finally:
            path.unlink(missing_ok=True)
        return ""
