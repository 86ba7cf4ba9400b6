"""The log watchdog of a run (the original platform's, made real; docs/health.md).

A job that writes nothing for its watchdog time is taken to have hung: an all-reduce that never
returns, a DataLoader worker that died, a deadlock. It would hold its nodes until its time limit,
or for ever. Who does what:

* The agent (runs.py) puts the run's watchdog time in the launch spec: the job's
  ``HF_WATCHDOG_TIME`` at submission, else the cluster's ``[agent] watchdog_s``; none for a
  development session (its idle shutdown is its own rule).
* The job may change it while it runs: ``hfai.set_watchdog_time(s)`` writes the seconds into the
  run's control directory (:data:`hfai.watchdog.WATCHDOG_FILE`), which the launcher reads every
  ``poll_s`` as untrusted input (safefs.py: the directory is the job's).
* The launcher measures the silence from the last byte of output it relayed (every process of the
  run on the node writes into the one pipe: any rank's line counts), on the monotonic clock. At the
  watchdog time it records :data:`HUNG_FILE` in the run directory, writes every process's Python
  stack into the log (``py-spy dump``; a process py-spy cannot read but that registered
  faulthandler, as ``import hfai`` does in a job, gets SIGUSR2 and writes its own), SIGTERMs the
  job's group and SIGKILLs it ``kill_s`` later.
* The agent reports the exit with the watchdog time it went past (``RunEvent.hung_s``); the
  controller fails the job, or requeues it at most ``--restart-on-hang`` times.
"""

from __future__ import annotations

import enum
import math
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hfai.agent import safefs
from hfai.agent.launchspec import LaunchSpec, WatchSpec
from hfai.agent.output import Output
from hfai.agent.statefile import write_state
from hfai.watchdog import STACK_SIGNAL, START_ENV, WATCHDOG_FILE

if TYPE_CHECKING:
    from hfai.protocol.types import RunWatch

HUNG_FILE = "hung"  # in the run directory: "<watchdog time> <silence>" once the launcher found it hung
# In the run directory, rewritten at most every poll while the run goes on: "<watchdog time>
# <time.monotonic() of its last output>", what the agent's heartbeat shows (RunWatch: hfai status).
WATCH_FILE = "watch"

# One process's dump in the log at most (a process of thousands of threads must not flood it).
DUMP_BYTES = 64 * 1024
# After SIGUSR2, the output is relayed until the pipe has been quiet this long (faulthandler
# writes from the signal handler at once), within the dump's time budget.
FAULT_QUIET_S = 0.3


@dataclass(frozen=True)
class WatchdogSettings:
    """``[agent] watchdog_s``, ``watchdog_poll_s``, ``watchdog_dump_s`` (see hfai.core.config)."""

    default_s: float = 1800.0
    poll_s: float = 1.0
    dump_s: float = 10.0


def parse_seconds(raw: bytes | str | None) -> float | None:
    """A watchdog time as written by a job (its control file, its environment): a finite number
    of seconds > 0, else None."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def run_watchdog_s(env: Mapping[str, str], dev: bool, default_s: float) -> float:
    """A run's watchdog time at its start (0: none): a development session has none; else the
    job's ``HF_WATCHDOG_TIME`` if it is a number of seconds, else the cluster's ``default_s``."""
    if dev:
        return 0.0
    own = parse_seconds(env.get(START_ENV))
    if own is not None:
        return own
    return default_s if math.isfinite(default_s) and default_s > 0 else 0.0


def watchdog_spec(watchdog_s: float, control: str, settings: WatchdogSettings, kill_s: float) -> WatchSpec:
    """The launch spec's watchdog part (see launcher.py): the time, where the job may change it,
    how often to look and how long the stacks may take, the grace between SIGTERM and SIGKILL."""
    return WatchSpec(watchdog_s=watchdog_s, control=control, poll_s=settings.poll_s, dump_s=settings.dump_s,
                     kill_s=kill_s)


class Verdict(enum.Enum):
    """What the launcher does to a silent job now: NONE; HUNG (record it, write the stacks, SIGTERM);
    KILL (SIGKILL: it outlived its grace after the SIGTERM)."""

    NONE = "none"
    HUNG = "hung"
    KILL = "kill"


def verdict(now: float, last_output: float, watchdog_s: float, hung_at: float | None, kill_s: float) -> Verdict:
    """Pure. ``last_output``: when the job last wrote (monotonic); ``hung_at``: when it was found
    hung (None: not yet). Once hung, output does not take the verdict back: the job was told."""
    if hung_at is not None:
        return Verdict.KILL if now - hung_at >= kill_s else Verdict.NONE
    if watchdog_s > 0 and now - last_output >= watchdog_s:
        return Verdict.HUNG
    return Verdict.NONE


def span(seconds: float) -> str:
    """``1800`` as ``30 min``, ``8`` as ``8 s`` (the log's words; reasons render their own)."""
    if seconds >= 3600:
        return f"{round(seconds / 3600, 1):g} h"
    return f"{round(seconds / 60, 1):g} min" if seconds >= 60 else f"{round(seconds, 1):g} s"


class RunWatchdog:
    """The launcher's watchdog over its run (launcher.py calls :meth:`check` after every wake)."""

    def __init__(self, spec: WatchSpec, run_dir: str, clock: Callable[[], float] = time.monotonic):
        self.watchdog_s = spec.watchdog_s
        self.control = spec.control
        self.poll_s = max(0.01, spec.poll_s)
        self.dump_s = spec.dump_s
        self.kill_s = spec.kill_s
        self.run_dir = run_dir
        self.clock = clock
        self.hung_at: float | None = None
        self.killed = False
        self._read_at = -math.inf
        self._told: tuple[float, float] | None = None  # what WATCH_FILE last said

    @classmethod
    def from_spec(cls, spec: LaunchSpec, run_dir: str,
                  clock: Callable[[], float] = time.monotonic) -> RunWatchdog | None:
        """The run's watchdog, None if it has none; ``clock``: the one its output's silence is
        measured on (Output.clock)."""
        return None if spec.watchdog is None else cls(spec.watchdog, run_dir, clock)

    def check(self, out: Output, group: int, spare: frozenset[int]) -> None:
        """Act on the silence of the job of process group ``group`` (``spare``: processes of the
        container, not the job's own, which get no stack dump)."""
        now = self.clock()
        if self.hung_at is None and now - self._read_at >= self.poll_s:
            self._read_at = now
            self.watchdog_s = parse_seconds(safefs.read_small(self.control, WATCHDOG_FILE)) or self.watchdog_s
            self._tell(out.last_output)
        act = verdict(now, out.last_output, self.watchdog_s, self.hung_at, self.kill_s)
        if act is Verdict.HUNG:
            self._hung(out, group, spare, now - out.last_output)
        elif act is Verdict.KILL and not self.killed:
            self.killed = True
            _killpg(group, signal.SIGKILL)

    def _tell(self, last_output: float) -> None:
        """Write what the agent shows (WATCH_FILE) if it changed; only a view: a failed write
        (a full disk) leaves the last one."""
        now = (self.watchdog_s, last_output)
        if now == self._told:
            return
        try:
            write_state(os.path.join(self.run_dir, WATCH_FILE), f"{now[0]:.3f} {now[1]:.3f}\n")
        except OSError:
            return
        self._told = now

    def _hung(self, out: Output, group: int, spare: frozenset[int], silent_s: float) -> None:
        # Recorded first: whoever sees the exit also sees why.
        write_state(os.path.join(self.run_dir, HUNG_FILE), f"{self.watchdog_s:.3f} {silent_s:.3f}\n", durable=True)
        out.write(f"=== hfai: no output for {span(silent_s)} (the job's watchdog time is {span(self.watchdog_s)}: "
                  f"hfai.set_watchdog_time, HF_WATCHDOG_TIME); the Python stacks of its processes follow, then it "
                  f"is stopped as hung, at {time.strftime('%H:%M:%S')} ===\n".encode())
        dump_stacks(job_processes(os.getpid(), spare), out, self.clock() + self.dump_s, find_py_spy(), self.clock)
        out.write(f"=== hfai: end of the stacks; stopping the job (SIGTERM, SIGKILL after "
                  f"{span(self.kill_s)}) at {time.strftime('%H:%M:%S')} ===\n".encode())
        self.hung_at = self.clock()
        _killpg(group, signal.SIGTERM)


def read_watch(run_dir: str | os.PathLike, key: str, now: float, ts: float) -> RunWatch | None:
    """The watchdog of run ``key`` as its launcher last wrote it (WATCH_FILE) in ``run_dir``,
    with its silence at ``now`` (time.monotonic(), the launcher's clock) and ``ts`` (the agent's
    wall time for the heartbeat); None if the run has no watchdog, or wrote nothing readable."""
    try:
        with open(os.path.join(run_dir, WATCH_FILE), "rb") as f:
            watchdog_s, last_output = (float(x) for x in f.read(128).split())
    except (OSError, ValueError):
        return None
    if not (math.isfinite(watchdog_s) and math.isfinite(last_output)) or watchdog_s <= 0:
        return None
    from hfai.protocol.types import RunWatch  # the agent's, not the launcher's (it starts lean)

    return RunWatch(run=key, watchdog_s=watchdog_s, silent_s=max(0.0, now - last_output), ts=ts)


def job_processes(root: int, spare: frozenset[int]) -> list[int]:
    """Every process below ``root`` (this launcher: a child subreaper, so the job's orphans are
    its children too) but those in ``spare``, parents before their children."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            ppid = _ppid(int(name))
            if ppid is not None:
                children.setdefault(ppid, []).append(int(name))
    out: list[int] = []
    todo = sorted(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        if pid not in spare:
            out.append(pid)
        todo.extend(sorted(children.get(pid, [])))
    return out


def dump_stacks(pids: list[int], out: Output, deadline: float, py_spy: str | None,
                clock: Callable[[], float] = time.monotonic) -> None:
    """Write the Python stacks of ``pids`` into the log, by ``deadline`` (monotonic): each read
    from outside by ``py_spy`` (None: none); those it cannot read that catch SIGUSR2
    (faulthandler) are asked to write their own."""
    asked = []
    for pid in pids:
        left = deadline - clock()
        if left <= 0:
            out.write(f"--- hfai: no time left for the stacks of {len(pids) - pids.index(pid)} more process(es) "
                      "([agent] watchdog_dump_s) ---\n".encode())
            break
        text = _py_spy_dump(py_spy, pid, left) if py_spy else None
        if text is not None:
            out.write(text)
        elif catches(pid, STACK_SIGNAL):
            try:
                os.kill(pid, STACK_SIGNAL)
                asked.append(pid)
            except ProcessLookupError:
                pass
        else:
            out.write(f"--- pid {pid} ({_cmdline(pid)}): no Python stack (not Python, or not readable) ---\n".encode())
    if asked:
        out.write(f"--- hfai: the stacks of pid {', '.join(map(str, asked))}, from faulthandler: ---\n".encode())
        _relay_until_quiet(out, deadline, clock)


def find_py_spy() -> str | None:
    """The py-spy of the agent's environment (the platform extra installs it beside the
    interpreter), else one on PATH."""
    return shutil.which("py-spy", path=os.path.dirname(sys.executable)) or shutil.which("py-spy")


def _py_spy_dump(py_spy: str, pid: int, timeout: float) -> bytes | None:
    try:
        done = subprocess.run([py_spy, "dump", "--pid", str(pid)], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or not done.stdout:
        return None
    text = done.stdout[:DUMP_BYTES]
    return text if text.endswith(b"\n") else text + b"\n"


def catches(pid: int, sig: int) -> bool:
    """Does process ``pid`` handle signal ``sig`` (its SigCgt mask)? Only then may it be sent one
    it would otherwise die of."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _relay_until_quiet(out: Output, deadline: float, clock: Callable[[], float]) -> None:
    if out.pipe_fd is None:
        return
    while (left := deadline - clock()) > 0:
        ready, _, _ = select.select([out.pipe_fd], [], [], min(left, FAULT_QUIET_S))
        if not ready or not out.pump():
            return


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    try:  # "pid (comm) state ppid ...": comm may hold spaces and parentheses
        return int(stat[stat.rindex(")") + 2:].split()[1])
    except (ValueError, IndexError):
        return None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(200)
    except OSError:
        return "gone"
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or "?"


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
