"""The fences this node honours.

The term fence: the newest leader's fence seen in an assignment, kept across restarts in
``<state>/fence``, so that an assignment of an older term is refused (:mod:`hfai.agent.assignment`).
The fence bound: how long the leader waits for a silent node before it moves its work, which its
launchers also self-fence by (launcher.py); a bound too tight for this agent's heartbeats is
warned about once.
"""

from __future__ import annotations

import logging
from pathlib import Path

from hfai.agent.diskwatch import DiskWatch
from hfai.agent.plan import fence_problem
from hfai.agent.statefile import LocalStateError, make_reserve, write_state

log = logging.getLogger(__name__)


class Fence:
    def __init__(self, path: Path, disk: DiskWatch, heartbeat_interval_s: float):
        self.path = path
        self.disk = disk
        self.heartbeat_interval_s = heartbeat_interval_s
        self.value = self._load()
        self.unsaved = False  # a full disk refused the newest fence: saved once it can be
        self._bound_warned: float | None = None
        if self.value:
            self._reserve()

    def raise_to(self, fence: int) -> None:
        """Accept ``fence`` (newer than :attr:`value`) and save it."""
        self.value = fence
        self.save()

    def retry(self) -> None:
        """Save the fence a full disk refused (at each heartbeat)."""
        if self.unsaved:
            self.save()

    def save(self) -> None:
        # Atomic: an agent killed while writing must not find a torn fence and accept stale work.
        try:
            write_state(self.path, str(self.value), durable=True)  # a full disk: its reserve
        except OSError as e:
            if not self.disk.full(e):
                raise LocalStateError(f"cannot save the fence {self.value}: {e}") from e
            # Kept in memory meanwhile, which is what refuses stale work while this agent lives
            # (and the server's compare-and-set refuses a stale leader's write in any case).
            if not self.unsaved:
                log.warning("cannot save the fence %d yet (the disk is full): retrying at each heartbeat",
                            self.value)
            self.unsaved = True
            return
        self.unsaved = False
        self._reserve()

    def check_bound(self, fence_s: float) -> None:
        """Warn (once per bound) when the leader's fence bound is too tight for our heartbeats."""
        problem = fence_problem(fence_s, self.heartbeat_interval_s)
        if problem and self._bound_warned != fence_s:
            log.warning("%s", problem)
        self._bound_warned = fence_s

    def _load(self) -> int:
        try:
            return int(self.path.read_text())
        except (FileNotFoundError, ValueError):
            return 0

    def _reserve(self) -> None:
        """After each save, room for the next on a full disk (the first save has none)."""
        try:
            make_reserve(self.path)
        except OSError as e:
            self.disk.full(e)  # another try at the next fence
