"""How the agent starts a run's launcher (``python -m hfai.agent.launcher RUN_DIR``, launcher.py):
the :class:`Launcher` interface and one implementation per way, chosen once from ``[agent]
launcher`` by :func:`make_launcher`.

* ``"fork"`` (:class:`ZygoteLauncher`): forked from a pre-imported zygote (zygote.py), about a
  millisecond; a zygote that fails or does not answer costs that one run an exec'd launcher.
* ``"exec"`` (:class:`ExecLauncher`): each launcher a fresh interpreter (its start and imports
  on every run).

Either way the launcher gets the agent's own environment, never the job's (see launcher.py), and a
session of its own; what it runs is in the run directory, written before it starts (runs.py).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

from hfai._proc import pid_alive
from hfai.agent import zygote
from hfai.agent.zygote import Zygote, ZygoteError

__all__ = ["LAUNCH_EXEC", "LAUNCH_FORK", "ExecLauncher", "Launched", "Launcher", "ZygoteLauncher",
           "make_launcher"]

LAUNCH_FORK = "fork"
LAUNCH_EXEC = "exec"

log = logging.getLogger(__name__)


class Launcher(Protocol):
    """Starts the launcher of a run whose directory holds its ``launch`` spec."""

    def start(self, key: str, run_dir: Path) -> int:
        """Start ``run_dir``'s launcher; returns its pid. OSError if no launcher could start."""
        ...

    def reap(self) -> None:
        """Collect the launchers of this agent's own that ended, so none lingers as a zombie."""
        ...

    def forget(self, key: str) -> None:
        """The run ``key`` was cleaned up: drop whatever is still kept for it."""
        ...

    def warm(self) -> None:
        """Make ready now what the first start would make (the agent calls it as it starts)."""
        ...


class ExecLauncher:
    """Each launcher a new interpreter, a child of the agent (reaped by :meth:`reap`)."""

    def __init__(self) -> None:
        self._children: dict[str, subprocess.Popen] = {}

    def start(self, key: str, run_dir: Path) -> int:
        popen = subprocess.Popen(
            [sys.executable, "-m", "hfai.agent.launcher", str(run_dir)], cwd=str(run_dir), stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )
        self._children[key] = popen
        return popen.pid

    def reap(self) -> None:
        for popen in list(self._children.values()):
            popen.poll()

    def forget(self, key: str) -> None:
        self._children.pop(key, None)

    def warm(self) -> None:
        pass  # nothing kept between runs


class ZygoteLauncher:
    """Launchers forked by the zygote (its children, not the agent's: nothing to reap); a run
    whose fork fails gets an exec'd launcher instead, and the next run a fresh zygote."""

    def __init__(self, reply_timeout_s: float = 5.0, source: Zygote | None = None) -> None:
        self.zygote = source if source is not None else zygote.shared(reply_timeout_s)
        self._fallback = ExecLauncher()

    def start(self, key: str, run_dir: Path) -> int:
        try:
            return self.zygote.spawn(str(run_dir))
        except ZygoteError as e:
            log.warning("%s; starting %s's launcher as a new process", e, key)
        return self._fallback.start(key, run_dir)

    def reap(self) -> None:
        self._fallback.reap()

    def forget(self, key: str) -> None:
        self._fallback.forget(key)

    def warm(self) -> None:
        self.zygote.warm()


def make_launcher(kind: str = LAUNCH_FORK, reply_timeout_s: float = 5.0) -> Launcher:
    """The launcher ``[agent] launcher`` names (``reply_timeout_s``: the zygote's answer bound)."""
    if kind == LAUNCH_FORK:
        return ZygoteLauncher(reply_timeout_s)
    if kind == LAUNCH_EXEC:
        return ExecLauncher()
    raise ValueError(f"[agent] launcher must be {LAUNCH_FORK!r} or {LAUNCH_EXEC!r}, not {kind!r}")


class Launched:
    """A run's launcher as started: its pid, and a wait for its end (it may be the agent's child
    or the zygote's, so this polls the pid and its creation time rather than reaping it)."""

    def __init__(self, pid: int, created: float, ticks: int | None = None):
        self.pid = pid
        self.created = created
        self.ticks = ticks  # its start in clock ticks since boot (_proc.start_ticks), if read

    def poll(self) -> bool | None:
        """True once the launcher has ended, else None (like Popen.poll, without a status: the
        status is the job's, in the run directory)."""
        return None if pid_alive(self.pid, self.created, self.ticks) else True

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"launcher {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return True

    def kill(self) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
