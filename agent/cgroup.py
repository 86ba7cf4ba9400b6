"""A cgroup per run: a memory and a pids limit, accounting (peak memory, CPU time, OOM kills), and
a kill that nothing in the run escapes.

The agent finds where it may make cgroups once, at start (:func:`detect`): a delegated cgroup v2
subtree (the agent's own cgroup is writable and offers the memory and pids controllers), else the
cgroup v1 hierarchies of the memory and pids controllers (writable by root). Runs then go
in ``<base>/<run key>`` of each hierarchy. Without either, runs get no cgroup, which the agent
says once at start and in ``hfai nodes``.

The launcher (launcher.py) makes the run's cgroup and moves itself into it before it starts the
container, so that every process of the run is born inside (moving the job in after it started
would race with its first fork). The launcher is small and sets its own OOM score to the floor, so
that an out-of-memory kill takes the job, not the process that records why it ended. Once the job
ended, :meth:`RunCgroup.kill_all` kills what is left but the launcher, which records the usage and
exits inside the cgroup; the agent removes the cgroup as it forgets the run (moving the launcher
out first would put the kernel's cgroup migration, an RCU grace period per hierarchy, on the path
of every run's end).
"""

from __future__ import annotations

import enum
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["CgroupKind", "CgroupSetup", "RunCgroup", "Usage", "detect", "parse_flat_keyed", "remove_left",
           "sigkill_each"]

CGROUP_FS = "/sys/fs/cgroup"
# Not cpuacct: every hierarchy a run joins costs its launcher a cgroup migration (an RCU grace
# period) on the path of every run, and the launcher, a subreaper that reaps all the
# run's processes, has their CPU time in its own rusage (launcher.py).
V1_CONTROLLERS = ("memory", "pids")
KILL_ROUNDS = 200  # kill-and-look rounds (each catches what forked meanwhile; the pids limit bounds it)
# A run's cgroup is "<job>.<run>" (a run key); one left empty this long is nobody's (remove_left).
_RUN_CGROUP = re.compile(r"^[A-Za-z0-9_-]{1,64}\.[0-9]{1,18}$")
LEFT_AGE_S = 600.0


class CgroupKind(enum.Enum):
    V2 = "v2"
    V1 = "v1"
    NONE = "none"


@dataclass(frozen=True)
class CgroupSetup:
    """Where this agent's runs get their cgroups: ``bases`` holds one folder per hierarchy (v1: the
    memory and pids ones, in that order; v2: one). ``reason``: why none, when NONE."""

    kind: CgroupKind
    bases: tuple[str, ...] = ()
    reason: str = ""

    def for_run(self, key: str) -> tuple[str, ...]:
        return tuple(os.path.join(b, key) for b in self.bases)


@dataclass(frozen=True)
class Usage:
    """What a run used, read from its cgroup once it ended."""

    peak_bytes: int = 0
    cpu_s: float = 0.0
    oom_kills: int = 0


def detect(node: str, root: str = CGROUP_FS, name: str = "hfai") -> CgroupSetup:
    """Where runs of ``node`` get cgroups on this host; made ready (folders, controllers) here."""
    v2 = _detect_v2(node, root, name)
    if v2.kind is CgroupKind.V2:
        return v2
    v1 = _detect_v1(node, root, name)
    if v1.kind is CgroupKind.V1:
        return v1
    return CgroupSetup(CgroupKind.NONE, reason=f"no cgroups for runs: {v2.reason}; {v1.reason}")


def remove_left(setup: CgroupSetup, min_age_s: float = LEFT_AGE_S, now: float | None = None) -> int:
    """Remove the run cgroups under ``setup``'s folders that hold no process and were made more than
    ``min_age_s`` ago; returns how many went. An agent removes a run's cgroup as it forgets the run,
    but one that stops in between (a restart, a cluster taken down with its runs), or whose state
    was deleted, leaves empty folders behind, each a memory cgroup the kernel keeps: the node's next
    agent calls this as it starts. Other clusters on the host may use the same node's name (local
    clusters do): a cgroup holding a process refuses removal (EBUSY), and the age spares the one a
    launcher made but has not joined yet (microseconds, by the folder's change time)."""
    now = time.time() if now is None else now
    gone = 0
    for base in setup.bases:
        try:
            entries = list(os.scandir(base))
        except OSError:
            continue
        for e in entries:
            if not _RUN_CGROUP.match(e.name):
                continue
            try:
                if not e.is_dir(follow_symlinks=False) or now - e.stat(follow_symlinks=False).st_ctime < min_age_s:
                    continue
                os.rmdir(e.path)
                gone += 1
            except OSError:
                continue  # busy (a live run's), or gone meanwhile
    return gone


def _detect_v1(node: str, root: str, name: str) -> CgroupSetup:
    bases = []
    for ctrl in V1_CONTROLLERS:
        top = Path(root) / ctrl
        if not (top / "cgroup.procs").exists():
            return CgroupSetup(CgroupKind.NONE, reason=f"cgroup v1 has no {ctrl} hierarchy at {top}")
        base = top / name / node
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            return CgroupSetup(CgroupKind.NONE, reason=f"cannot make {base}: {e.strerror}")
        if not os.access(base, os.W_OK):
            return CgroupSetup(CgroupKind.NONE, reason=f"{base} is not writable")
        if ctrl == "memory":
            _try_write(base.parent / "memory.use_hierarchy", "1")  # a run's limit covers its children
        bases.append(str(base))
    return CgroupSetup(CgroupKind.V1, tuple(bases))


def _detect_v2(node: str, root: str, name: str) -> CgroupSetup:
    """A delegated v2 subtree: the agent's own cgroup, writable, offering memory and pids. The agent
    moves itself into a leaf (``<own>/agent``: v2 allows processes only in leaves once controllers
    are enabled below) and enables the controllers for ``<own>/<name>-<node>``."""
    rootp = Path(root)
    if not (rootp / "cgroup.controllers").exists():
        return CgroupSetup(CgroupKind.NONE, reason=f"{root} is not a cgroup v2 hierarchy")
    own = _own_v2_path()
    if own is None:
        return CgroupSetup(CgroupKind.NONE, reason="this process is in no cgroup v2")
    mine = rootp / own.lstrip("/")
    if mine.name == "agent":  # already in its leaf (an earlier start, or systemd's DelegateSubgroup=agent)
        mine = mine.parent
    try:
        offered = set((mine / "cgroup.controllers").read_text().split())
    except OSError as e:
        return CgroupSetup(CgroupKind.NONE, reason=f"cannot read {mine}: {e.strerror}")
    missing = {"memory", "pids"} - offered
    if missing:
        return CgroupSetup(CgroupKind.NONE, reason=f"cgroup v2 at {mine} offers no {', '.join(sorted(missing))}")
    if not os.access(mine, os.W_OK):
        return CgroupSetup(CgroupKind.NONE, reason=f"cgroup v2 at {mine} is not delegated to this user")
    try:
        leaf = mine / "agent"
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(f"{os.getpid()}\n")
        wanted = " ".join(f"+{c}" for c in ("memory", "pids", "cpu") if c in offered)
        (mine / "cgroup.subtree_control").write_text(wanted)
        base = mine / f"{name}-{node}"
        base.mkdir(exist_ok=True)
        (base / "cgroup.subtree_control").write_text(wanted)
    except OSError as e:
        return CgroupSetup(CgroupKind.NONE, reason=f"cannot set up cgroup v2 at {mine}: {e.strerror}")
    return CgroupSetup(CgroupKind.V2, (str(base),))


def _own_v2_path() -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                hier, _, path = line.rstrip("\n").partition("::")
                if hier == "0":
                    return path
    except OSError:
        pass
    return None


def _write(path: str | Path, text: str) -> None:
    """Write a cgroup file with two system calls. The run's cgroup is made and joined by its
    launcher, a process forked from the zygote: Path.write_text's text layer (an encoder, a
    buffered writer) is Python code the launcher would run, and every object it touches copies a
    page from the zygote (docs/performance.md)."""
    # As write_text opens it: on a cgroup's own files, O_CREAT and O_TRUNC do nothing.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _try_write(path: str | Path, text: str) -> bool:
    try:
        _write(path, text)
        return True
    except OSError:
        return False


def parse_flat_keyed(text: str) -> dict[str, int]:
    """A cgroup "flat keyed" file (``key value`` per line: memory.events, memory.oom_control)."""
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        try:
            out[key] = int(value)
        except ValueError:
            continue
    return out


class RunCgroup:
    """One run's cgroup (one folder per hierarchy), used by its launcher."""

    # Folders as strings and files through os calls (_write, _read): the launcher, forked from the
    # zygote, runs this on every run's path, where pathlib's Python code copies pages (see _write).
    def __init__(self, kind: CgroupKind, dirs: tuple[str, ...]):
        self.kind = kind
        self.dirs = tuple(os.fspath(d) for d in dirs)

    @classmethod
    def create(cls, kind: CgroupKind, dirs: tuple[str, ...], memory_bytes: int, pids_max: int) -> RunCgroup:
        cg = cls(kind, dirs)
        for d in cg.dirs:
            try:
                os.mkdir(d)
            except FileExistsError:
                pass
        mem = cg.dirs[0]
        if memory_bytes > 0:
            if kind is CgroupKind.V2:
                _write(f"{mem}/memory.max", str(memory_bytes))
                _try_write(f"{mem}/memory.swap.max", "0")
            else:
                _write(f"{mem}/memory.limit_in_bytes", str(memory_bytes))
                _try_write(f"{mem}/memory.memsw.limit_in_bytes", str(memory_bytes))  # no swapping past it
        if pids_max > 0:
            pids = mem if kind is CgroupKind.V2 else cg.dirs[1]
            _write(f"{pids}/pids.max", str(pids_max))
        return cg

    def join(self, pid: int) -> None:
        for d in self.dirs:
            _write(f"{d}/cgroup.procs", f"{pid}\n")

    def members(self) -> set[int]:
        try:
            text = _read_or_fail(f"{self.dirs[0]}/cgroup.procs")
        except OSError:
            return set()
        return {int(p) for p in text.split()}

    def kill_all(self, spare: int = 0) -> int:
        """SIGKILL every process of the run but ``spare`` (the launcher) until none is left;
        returns how many were killed. A process forking meanwhile is caught in a later round."""
        killed: set[int] = set()
        for _ in range(KILL_ROUNDS):
            left = self.members() - {spare}
            if not left:
                break
            killed |= sigkill_each(left)
            _reap_children()
            time.sleep(0.005)
        return len(killed)

    def usage(self) -> Usage:
        mem = self.dirs[0]
        if self.kind is CgroupKind.V2:
            peak = _read_int(f"{mem}/memory.peak")
            events = parse_flat_keyed(_read(f"{mem}/memory.events"))
            cpu = parse_flat_keyed(_read(f"{mem}/cpu.stat")).get("usage_usec", 0) / 1e6
            return Usage(peak, cpu, events.get("oom_kill", 0))
        peak = _read_int(f"{mem}/memory.max_usage_in_bytes")
        oom = parse_flat_keyed(_read(f"{mem}/memory.oom_control")).get("oom_kill", 0)
        return Usage(peak, 0.0, oom)  # v1: no CPU time here (V1_CONTROLLERS); the launcher's rusage has it

    def remove(self) -> bool:
        """Remove the run's folders; False if one is still there: busy a moment after its last
        process exited (the kernel frees a cgroup's tasks asynchronously), or a process that would
        not die. The agent tries again later (RunStore.empty_trash)."""
        left = False
        for d in self.dirs:
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError:
                left = True
        return not left


def sigkill_each(pids) -> set[int]:
    """SIGKILL each of ``pids``; returns those that were there to kill (gone or no longer ours:
    skipped)."""
    killed = set()
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def _reap_children() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _read_or_fail(path: str) -> str:
    """A cgroup file's text, read with os calls (see _write)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode()


def _read(path: str) -> str:
    try:
        return _read_or_fail(path)
    except OSError:
        return ""


def _read_int(path: str) -> int:
    try:
        return int(_read(path).split()[0])
    except (ValueError, IndexError):
        return 0
