"""The run-directory layout: runs on this node as directories and the files in them, and what
the agent does through them (start, signal, inspect, adopt, clean up). What a job runs with is
jobenv.py's; how its launcher starts is launchers.py's.

Layout under ``state_dir`` (0711: job users may pass through to their own control directory)::

    runs/                            0700, the agent's alone: nothing in it is the job's to read
    runs/<job>.<run>/assignment      the RunAssignment (msgpack) this run was started from
    runs/<job>.<run>/launch          what the launcher runs, as whom: a LaunchSpec (launchspec.py)
    runs/<job>.<run>/launcher_pid    pid and start time of the launcher (wall, then clock ticks
                                     since boot: _proc.start_ticks, which a clock step leaves be)
    runs/<job>.<run>/child_pid       the job's pid = its process group (written by the launcher)
    runs/<job>.<run>/exit_code       written by the launcher when the job exits
    runs/<job>.<run>/term            when the agent sent SIGTERM (a stamp: wall and boot clock,
                                     stamps.py; the interrupt windows run on the boot clock)
    runs/<job>.<run>/killed          the agent sent SIGKILL (empty)
    runs/<job>.<run>/suspend_raised  when the agent raised the suspend flag (a stamp)
    runs/<job>.<run>/ack_seen        when the agent first saw the job's acknowledgement (a stamp)
    runs/<job>.<run>/fenced          the launcher stopped the job: the agent was silent too long
    runs/<job>.<run>/hung            the launcher ended the job as hung: it wrote nothing for its
                                     watchdog time (watchdog.py)
    runs/<job>.<run>/usage           what the run used (its cgroup: peak memory, CPU, OOM kills)
    runs/<job>.<run>/watch           the run's watchdog time and when the job last wrote (the
                                     launcher's, at most once a poll; the heartbeat shows it)
    alive                            time.monotonic() of the last heartbeat NATS accepted: the
                                     launchers stop their jobs when it gets too old (launcher.py)
    runs/<job>.<run>/<event>.sent    an event the leader has received (published and acked)
    control/<job>.<run>/             the job's control channel (suspend, ack, whole_life_state):
                                     owned by the job's user, 0700; read as untrusted (safefs.py)
    logs/<job>/                      0711, the agent's: no one lists it, the job cannot plant links
    logs/<job>/rank<r>.log           stdout+stderr of every run of the job on this node (appended),
                                     owned by the job's user, 0600
    trash/                           0700: run and control directories of forgotten runs, moved
                                     there at once and deleted in the background

Everything is a file, so an agent restarted while jobs run finds them all again (adoption), each
in the lifecycle state its files record (lifecycle.py).
"""

from __future__ import annotations

import collections
import errno
import json
import logging
import math
import os
import re
import shutil
import signal
import stat
import time
from pathlib import Path

import psutil

from hfai import base_envs
from hfai._atomic import write_atomic
from hfai._job import ACK_FILE, SUSPEND_FILE, WHOLE_LIFE_FILE
from hfai._proc import pid_alive, start_ticks
from hfai.agent import safefs, stamps
from hfai.agent.cgroup import CgroupKind, RunCgroup
from hfai.agent.contain import Containment
from hfai.agent.devsession import ENTRYPOINT as DEV_ENTRYPOINT
from hfai.agent.devsession import notebooks_dir
from hfai.agent.identity import RUN_AS_SUBMITTER, JobIdentity, agent_account, job_identity, lookup_account
from hfai.agent.jobenv import env_note, job_command, job_python
from hfai.agent.launcher import ALIVE_FILE, ALIVE_WIDTH, FENCED_FILE, LAUNCH_FILE, USAGE_FILE
from hfai.agent.launchers import Launched, Launcher, make_launcher
from hfai.agent.launchspec import Fencing, LaunchSpec, Limits, SwitchTo
from hfai.agent.logcap import check_cap
from hfai.agent.plan import LocalRun, RunPhase, RunUsage
from hfai.agent.stamps import ACK_STAMP, SUSPEND_STAMP
from hfai.agent.statefile import (
    RESERVE_BYTES,
    RESERVE_SUFFIX,
    blank_names,
    disk_full,
    make_reserve,
    touch,
    write_state,
    write_volatile,
)
from hfai.agent.trust import StartError, inside, is_run_key, run_problem
from hfai.agent.watchdog import HUNG_FILE, WatchdogSettings, run_watchdog_s, watchdog_spec
from hfai.core.clock import SYSTEM, Clock
from hfai.protocol import decode, encode
from hfai.protocol.errors import InvalidRequest, ProtocolError
from hfai.protocol.names import is_token
from hfai.protocol.types import FENCE_KILL_FACTOR, JOB_DEV, RunAssignment, RunEventKind

__all__ = ["DiskFull", "RunStore", "fence_spec", "settle_exit"]

KILLED_FILE = "killed"  # in a run directory: the agent sent SIGKILL
CONTAINMENT_FILE = "containment"  # in the state directory: Containment.summary, written at start
CGROUP_REMOVE_S = 2.0  # how long a round of the trash waits for a forgotten run's cgroup to empty
# The files a run must be able to write on a full disk, each with a reserve (statefile.py).
RESERVED = ("exit_code", "child_pid", FENCED_FILE, HUNG_FILE, "term", SUSPEND_STAMP, ACK_STAMP)
# Forgotten run directories kept, emptied but for their unused reserves and blanks, as the next
# runs' (see RunStore.empty_trash): at most this many.
SPARES_MAX = 32
AGENT_POOL = "a"  # the agent's blanks in a run directory (statefile.py)
# A run directory in the trash: "<run key>.<agent pid>.<count>" (RunStore.cleanup); a control
# directory's name there ("<run key>.control.<pid>.<count>") never matches.
_TRASHED_RUN = re.compile(r"^[A-Za-z0-9_-]{1,64}\.[0-9]{1,18}\.[0-9]+\.[0-9]+$")

log = logging.getLogger(__name__)


class DiskFull(OSError):
    """This node's state directory has no room for a run: the run did not start and left
    nothing here (it may start here later). The message says so, for the user; ``errno`` is the
    disk's (ENOSPC, EDQUOT)."""

    def __init__(self, message: str, code: int | None):
        super().__init__(message)
        self.errno = code or errno.ENOSPC


class RunStore:
    def __init__(self, state_dir: str | os.PathLike, node: str, env_root: str | os.PathLike,
                 run_as: str = RUN_AS_SUBMITTER, fence_poll_s: float = 0.5, datasets_dir: str = "",
                 launcher: Launcher | None = None, log_cap_bytes: int = 0, clock: Clock = SYSTEM,
                 containment: Containment | None = None, notebooks_root: str = "",
                 watchdog: WatchdogSettings | None = None):
        """``launcher``: how runs' launchers start (default: forked from the zygote); ``clock``:
        the agent's, for the times the plan reads back (SIGTERM's); ``containment``: the
        container and cgroup of each run (None: neither); ``watchdog``: the runs' log watchdog
        (watchdog.py; None: runs have one only if the job asks, HF_WATCHDOG_TIME)."""
        self.root = Path(state_dir)
        self.runs_dir = self.root / "runs"
        self.logs_dir = self.root / "logs"
        self.control_root = self.root / "control"
        self.trash_dir = self.root / "trash"  # made on first use (see cleanup)
        self.spare_dir = self.root / "spare"  # made on first use (see empty_trash)
        self._trashed = 0
        self._cgroups_left: list[RunCgroup] = []  # forgotten runs' cgroups, for empty_trash to remove
        for d, mode in ((self.root, 0o711), (self.runs_dir, 0o700), (self.logs_dir, 0o711), (self.control_root, 0o711)):
            d.mkdir(parents=True, exist_ok=True)
            d.chmod(mode)
        self._real_root = self.root.resolve()
        # Spare run directories (made whole by empty_trash, in its thread; taken by start): a
        # deque's append and popleft are atomic.
        self._spares: collections.deque[Path] = collections.deque(
            Path(e.path) for e in (os.scandir(self.spare_dir) if self.spare_dir.is_dir() else ()))
        if run_as == RUN_AS_SUBMITTER and os.geteuid() == 0:
            _warn_if_unreachable(self.control_root)
        self.node = node
        self.env_root = Path(env_root)
        self.run_as = run_as
        self.fence_poll_s = fence_poll_s
        self.datasets_dir = datasets_dir  # HFAI_DATASETS_DIR of jobs: [storage] dataset_root
        self.log_cap_bytes = check_cap(log_cap_bytes)
        self.agent = agent_account()
        self.launcher = launcher if launcher is not None else make_launcher()
        self.clock = clock
        self.containment = containment
        self.notebooks_root = notebooks_root
        self.watchdog = watchdog if watchdog is not None else WatchdogSettings(default_s=0.0)
        if containment is not None:
            # For `hfai local status`, which reads the node's state rather than asking the API.
            write_atomic(self.root / CONTAINMENT_FILE, f"{containment.summary}\n".encode())

    # ------------------------------------------------------------------------------ inspect

    def dir(self, key: str) -> Path:
        if not is_run_key(key):
            raise InvalidRequest(f"{key!r} is not a run key")
        return inside(self._real_root, self.runs_dir / key)

    def control_dir(self, key: str) -> Path:
        if not is_run_key(key):
            raise InvalidRequest(f"{key!r} is not a run key")
        return inside(self._real_root, self.control_root / key)

    def log_path(self, job_id: str, rank: int) -> Path:
        if not is_token(job_id) or rank < 0:
            raise InvalidRequest(f"no log file for job {job_id!r} rank {rank}")
        return inside(self._real_root, self.logs_dir / job_id / f"rank{rank}.log")

    def environments(self) -> tuple[str, ...]:
        """The environments offered: the base environments' names and aliases, and users' (folders
        with a bin/ whose names are valid names)."""
        return base_envs.offered(self.env_root)

    def snapshot(self) -> dict[str, LocalRun]:
        """Every run directory on the node, with its current phase."""
        self.launcher.reap()
        out = {}
        for d in sorted(self.runs_dir.iterdir()) if self.runs_dir.is_dir() else ():
            try:
                out[d.name] = self._load(d)
            except (OSError, ProtocolError, InvalidRequest) as e:
                log.warning("ignoring unreadable run directory %s: %s", d, e)
        return out

    def _load(self, d: Path) -> LocalRun:
        ra = decode((d / "assignment").read_bytes(), RunAssignment)
        exit_file = d / "exit_code"
        first = _read_int(exit_file)
        alive = first is None and self._launcher_alive(d)
        # Read again once the launcher is seen gone: it may have written the status and exited
        # between the first read and the liveness test (see settle_exit).
        second = _read_int(exit_file) if first is None and not alive else None
        phase, exit_code = settle_exit(first, alive, second)
        control = self.control_dir(d.name)
        acked = safefs.lstat_mtime(control, ACK_FILE) is not None
        return LocalRun(
            key=d.name, assignment=ra, phase=phase, exit_code=exit_code,
            # The agent's own stamps (stamps.py): a flag without one is a full disk's
            # (raise_suspend), and its time is converted once.
            suspend_ts=stamps.read(d / SUSPEND_STAMP, self.clock, safefs.lstat_mtime(control, SUSPEND_FILE)),
            acked=acked,
            ack_ts=self._ack_seen(d, control) if acked else None,
            ack_stop=acked and _asks_to_stop(safefs.read_small(control, ACK_FILE)),
            term_ts=stamps.read(d / "term", self.clock),
            killed=(d / KILLED_FILE).exists(),
            fenced=(d / FENCED_FILE).exists(),
            hung_s=_read_hung(d / HUNG_FILE),
            lost=first is None and not alive and second is None,
            sent=frozenset(k for k in RunEventKind if (d / f"{k.value}.sent").exists()),
            usage=_read_usage(d / USAGE_FILE) if phase is RunPhase.EXITED else None,
        )

    def _ack_seen(self, d: Path, control: Path) -> float | None:
        """When the agent first saw the run's acknowledgement, on the boot clock: the job wrote the
        ack file and may date it as it likes, so only its existence counts. If the first sight
        cannot be recorded (a full disk and no reserve), the file's own time stands in."""
        try:
            return stamps.write_once(d / ACK_STAMP, self.clock)
        except OSError as e:
            log.warning("could not record when run %s acknowledged: %s", d.name, e)
            mtime = safefs.lstat_mtime(control, ACK_FILE)
            return None if mtime is None else stamps.from_wall(mtime, self.clock)

    def _launcher_alive(self, d: Path) -> bool:
        text = _read_text(d / "launcher_pid")
        if text is None:
            return False
        fields = text.split()
        try:
            pid, created = int(fields[0]), float(fields[1])
            ticks = int(fields[2]) if len(fields) > 2 else None  # none: /proc had no start for it
        except (ValueError, IndexError):
            return False
        return pid_alive(pid, created, ticks)  # a recycled pid belongs to a process created at another time

    def whole_life_state(self, key: str) -> int | None:
        """The job's last whole-life state; None unless its file holds a 64-bit integer."""
        raw = safefs.read_small(self.control_dir(key), WHOLE_LIFE_FILE)
        try:
            value = int(raw) if raw else None
        except ValueError:
            return None
        return value if value is not None and -(1 << 63) <= value < (1 << 63) else None

    # -------------------------------------------------------------------------------- act

    def start(self, ra: RunAssignment) -> Launched | None:
        """Create the run directory and launch the job; raises StartError if it cannot run here.

        The assignment is not fsynced here: the launcher fsyncs it with the exit status once the
        job is over (launcher.py). A crash of the host before that can leave the directory with
        an assignment missing or empty, which the snapshot cannot read, so the plan asks to start
        the run again: :meth:`_interrupted` then records it as over instead (returns None)."""
        d = self.dir(ra.key)
        try:
            reserved = self._make_run_dir(d)
        except FileExistsError:
            self._interrupted(ra, d)
            return None
        except OSError as e:
            raise self._no_room(ra, e) from None
        try:
            self._write_run_files(ra, d, reserved)
        except OSError as e:
            raise self._no_room(ra, e) from None
        try:
            spec = self._prepare(ra, d)
        except (StartError, OSError) as e:
            if isinstance(e, OSError) and disk_full(e):
                raise self._no_room(ra, e) from None
            write_state(d / "exit_code", b"127\n", durable=True)
            try:
                write_atomic(d / "start_error", str(e).encode())
            except OSError as e2:
                log.warning("could not record why %s did not start: %s", ra.key, e2)
            if isinstance(e, StartError):
                raise
            raise StartError(f"cannot prepare the run on node {self.node}: {e}") from None
        try:
            write_volatile(d / LAUNCH_FILE, spec.to_json(), AGENT_POOL)  # read by this boot's launcher only
        except OSError as e:
            raise self._no_room(ra, e) from None
        return self._launch(ra, d)

    def _no_room(self, ra: RunAssignment, e: OSError) -> OSError:
        """What to raise for ``e`` met while starting ``ra``: on a full disk, DiskFull, and the
        run's directories go (it never started here, and may start here later); else ``e``."""
        if not disk_full(e):
            return e
        shutil.rmtree(self.runs_dir / ra.key, ignore_errors=True)
        shutil.rmtree(self.control_root / ra.key, ignore_errors=True)
        return DiskFull(self.full_reason(e), e.errno)

    def _make_run_dir(self, d: Path) -> bool:
        """Make run directory ``d``: a spare one renamed into place, with its reserves (returns
        True), else a new one (False). FileExistsError if ``d`` is there: no run starts twice.

        A new file costs far more than a rename where the filesystem looks for a free inode (on
        ext4 without a journal, it steps over every inode freed in the last seconds, 0.3-0.5 ms
        of CPU per file at a few dozen runs a second: docs/performance.md), and the reserves are
        seven files per run that, unused, are as good for the next run."""
        if os.path.lexists(d):
            raise FileExistsError(errno.EEXIST, "run directory exists", str(d))
        while self._spares:
            spare = self._spares.popleft()
            try:
                # Only this agent makes run directories, one at a time, and ``d`` is not there:
                # the rename, which would replace an empty directory, replaces nothing.
                os.rename(spare, d)
                return True
            except FileNotFoundError:
                continue  # gone meanwhile (a sweep of the state by hand): the next
            except OSError as e:
                if disk_full(e):
                    raise
                break
        d.mkdir(mode=0o700)
        return False

    def _write_run_files(self, ra: RunAssignment, d: Path, reserved: bool = False) -> None:
        """The assignment, and (unless ``reserved``: a spare directory has them) the reserves of
        the files a run must write even on a full disk (statefile.py): the job's pid, its exit
        status, the fence and SIGTERM markers."""
        write_volatile(d / "assignment", encode(ra), AGENT_POOL)
        if not reserved:
            for name in RESERVED:
                make_reserve(d / name)

    def full_reason(self, e: OSError | None = None) -> str:
        """What a run or the node is told when this node's state directory is full."""
        code = errno.errorcode.get(e.errno, "ENOSPC") if e is not None and e.errno else "ENOSPC"
        return f"state directory full: {self.root} ({code})"

    def _interrupted(self, ra: RunAssignment, d: Path) -> None:
        """This node had run ``ra`` (its directory is the record: no run starts twice), but a crash
        left the directory unreadable. Whatever ran died with the host: record the run as an
        exec'd launcher that died does read (killed, unless its exit status reached the disk), so
        that the next snapshot reports its end, instead of asking to start it again for ever."""
        log.warning("run %s was cut short by a crash of this node; reporting it ended", ra.key)
        if _read_int(d / "exit_code") is None:
            write_atomic(d / "exit_code", f"{-signal.SIGKILL}\n".encode())
        write_atomic(d / "assignment", encode(ra))

    def _prepare(self, ra: RunAssignment, d: Path) -> LaunchSpec:
        """Everything the launcher needs (see launcher.py); StartError if the run may not start."""
        problem = run_problem(ra)
        if problem:
            raise StartError(f"refused: {problem}")
        who = job_identity(ra.user, self.run_as, self.agent, lookup_account)
        control = self._make_control_dir(ra.key, who)
        argv, env = job_command(ra, who, node=self.node, control_dir=str(control), run_as=self.run_as,
                                env_root=self.env_root, datasets_dir=self.datasets_dir)
        limits = Limits()
        if self.containment is not None:
            if self.notebooks_root and tuple(ra.entrypoint[1:3]) == DEV_ENTRYPOINT[1:3]:
                env["HFAI_NOTEBOOKS_DIR"] = str(notebooks_dir(self.notebooks_root, ra.user, Path("/")))
            python = job_python(ra, self.env_root)
            argv, limits = self.containment.wrap(ra, who, argv, env, str(control), self.run_as, python,
                                                    str(self.env_root))
        watchdog_s = run_watchdog_s(ra.env, _is_dev(ra), self.watchdog.default_s)
        watch = watchdog_spec(watchdog_s, str(control), self.watchdog, ra.kill_window_s) if watchdog_s > 0 else None
        a = who.account
        return LaunchSpec(
            argv=tuple(argv), env=env, cwd=ra.workdir, log=str(self._open_log(ra, who)), log_cap=self.log_cap_bytes,
            limits=limits, fence=fence_spec(ra.fence_s, self._real_root / ALIVE_FILE, self.fence_poll_s),
            watchdog=watch, switch=SwitchTo(a.uid, a.gid, tuple(a.groups)) if who.switch else None)

    def _launch(self, ra: RunAssignment, d: Path) -> Launched:
        try:
            pid = self.launcher.start(ra.key, d)
        except OSError as e:
            write_atomic(d / "exit_code", b"127\n")
            raise StartError(f"cannot start the launcher on node {self.node}: {e}") from None
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            created = time.time()  # already gone: it wrote its exit status, or none and counts as killed
        ticks = start_ticks(pid)
        stamp = f"{pid} {created}" if ticks is None else f"{pid} {created} {ticks}"
        write_volatile(d / "launcher_pid", stamp.encode(), AGENT_POOL)  # a pid means nothing after a reboot
        return Launched(pid, created, ticks)

    def _make_control_dir(self, key: str, who: JobIdentity) -> Path:
        """The job's control directory, its user's alone (0700): no other job can raise a suspend
        flag in it or read its state."""
        control = inside(self._real_root, self.control_root / key)
        shutil.rmtree(control, ignore_errors=True)  # a leftover of an interrupted clean-up
        control.mkdir(mode=0o700)
        if who.switch:
            os.chown(control, who.account.uid, who.account.gid)
        return control

    def _open_log(self, ra: RunAssignment, who: JobIdentity) -> Path:
        logf = self.log_path(ra.job_id, ra.rank)
        logf.parent.mkdir(mode=0o711, exist_ok=True)
        logf.parent.chmod(0o711)  # mkdir's mode is less the umask
        owner = (who.account.uid, who.account.gid) if who.switch else None
        try:
            fd = safefs.open_log(logf, owner)
        except OSError as e:
            if disk_full(e):
                raise
            raise StartError(f"cannot open the log file {logf} on node {self.node}: {e}") from None
        with open(fd, "ab") as f:
            f.write(f"=== hfai: job {ra.name} ({ra.job_id}) run {ra.run_id}, suspend count {ra.suspend_count}, "
                    f"rank {ra.rank}/{ra.world_size} on {self.node} at {time.strftime('%H:%M:%S')} ===\n".encode())
            if ra.env_name:  # which environment HF_ENV_NAME got (a base one may be asked by an alias)
                f.write(f"=== hfai: {env_note(ra, self.env_root)} ===\n".encode())
        return logf

    def raise_suspend(self, key: str) -> None:
        # The window runs from the agent's own stamp, made first: a flag the job deletes or dates
        # moves nothing. Without the stamp (a full disk past its reserve) the flag's time stands in.
        try:
            write_state(self.dir(key) / SUSPEND_STAMP, stamps.stamp(self.clock), durable=True)
        except OSError as e:
            log.warning("could not stamp the suspend of %s: %s", key, e)
        # Created, never overwritten: the control directory is the job's (see safefs.py).
        if not safefs.create_flag(self.control_dir(key), SUSPEND_FILE, f"{self.clock.time()}\n".encode()):
            log.warning("could not raise the suspend flag of %s: something is already at its place", key)

    def signal(self, key: str, sig: int) -> None:
        d = self.dir(key)
        if sig == signal.SIGTERM and not (d / "term").exists():
            write_state(d / "term", stamps.stamp(self.clock), durable=True)  # a full disk: its reserve
        elif sig == signal.SIGKILL:
            _mark_killed(d / KILLED_FILE)
        pgid = _read_int(d / "child_pid")
        if pgid is None:
            # The launcher has not started the job yet: stop the launcher itself.
            pid_s = (_read_text(d / "launcher_pid") or "").partition(" ")[0]
            pgid = int(pid_s) if pid_s.isdigit() else None
        if pgid is None or pgid <= 1:
            return
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def mark_alive(self, stamp: float) -> None:
        """Tell this node's launchers the agent is alive (``stamp``: time.monotonic() taken before
        a heartbeat that NATS then accepted). Not fsynced: a monotonic stamp means nothing after
        a reboot, and an fsync could stall the agent's event loop on a busy disk."""
        path = self.root / ALIVE_FILE
        text = f"{stamp:{ALIVE_WIDTH}.6f}\n".encode()  # one width: see below
        tmp = path.with_name(f"{ALIVE_FILE}.tmp")
        try:
            tmp.write_bytes(text)
            os.replace(tmp, path)  # a launcher reads the old stamp or the new, never half of one
        except OSError as e:
            if not disk_full(e):
                raise
            tmp.unlink(missing_ok=True)
            # A full disk: overwrite the stamp in place, which takes no new block (every stamp has
            # the same width). A launcher could read half of one, so it reads until two reads
            # agree (launcher.read_stamp). No stamp yet: the disk's error stands.
            try:
                fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                raise e from None
            try:
                if os.fstat(fd).st_size != len(text):
                    raise e
                os.pwrite(fd, text, 0)
            finally:
                os.close(fd)

    def container_pid(self, key: str) -> int | None:
        """The pid of the container's pid 1 of run ``key`` (what its launcher wrote as the job's
        group), None if the run is in no container or has no pid yet."""
        d = self.dir(key)
        try:
            spec = LaunchSpec.from_json((d / LAUNCH_FILE).read_bytes())
        except (OSError, ValueError):
            return None
        if not spec.limits.contained:
            return None
        return _read_int(d / "child_pid")

    def end_leftovers(self, key: str) -> int:
        """Kill whatever is left of run ``key`` in its cgroup (its launcher died without ending
        it: a container dies with its launcher, a bare process does not) and remove the cgroup;
        returns how many processes were killed. Without a cgroup, nothing to go by: 0."""
        c = self.containment
        if c is None or c.cgroups.kind is CgroupKind.NONE:
            return 0
        cg = RunCgroup(c.cgroups.kind, c.cgroups.for_run(key))
        killed = cg.kill_all()
        cg.remove()  # or, still busy for a moment, once the run is forgotten (empty_trash)
        return killed

    def mark_sent(self, key: str, kind: RunEventKind) -> None:
        touch(self.dir(key) / f"{kind.value}.sent", AGENT_POOL)  # not fsynced: see statefile.py

    def record_never_ran(self, ra: RunAssignment) -> None:
        d = self.dir(ra.key)
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(d / "assignment", encode(ra))
        write_atomic(d / "exit_code", b"-1\n")

    def log_last_writes(self) -> dict[str, float]:
        """Per job with logs here, the newest modification time among its log files."""
        out = {}
        for d in self.logs_dir.iterdir() if self.logs_dir.is_dir() else ():
            try:
                out[d.name] = max((f.stat().st_mtime for f in d.iterdir()), default=d.stat().st_mtime)
            except OSError:
                continue  # removed meanwhile
        return out

    def remove_logs(self, job_id: str) -> None:
        if is_token(job_id):
            shutil.rmtree(inside(self._real_root, self.logs_dir / job_id), ignore_errors=True)

    def cleanup(self, key: str) -> None:
        """Forget a run: its run and control directories move to ``trash/`` (a rename each, so
        a snapshot sees the run whole or not at all), which :meth:`empty_trash` deletes later, off
        the agent's event loop: deleting them there would make the next run's exit and events
        wait."""
        self.launcher.forget(key)
        self._forget_cgroup(key)
        try:
            self.trash_dir.mkdir(mode=0o700, exist_ok=True)
        except OSError as e:
            if not disk_full(e):
                raise
            # No room for the trash: delete at once, which is what gives room back.
            shutil.rmtree(self.dir(key), ignore_errors=True)
            shutil.rmtree(inside(self._real_root, self.control_root / key), ignore_errors=True)
            return
        self._trashed += 1
        stamp = f"{os.getpid()}.{self._trashed}"  # unique: a key can come back (record_never_ran)
        for src, name in ((self.dir(key), key), (inside(self._real_root, self.control_root / key), f"{key}.control")):
            try:
                os.rename(src, self.trash_dir / f"{name}.{stamp}")
            except FileNotFoundError:
                pass

    def empty_trash(self) -> int:
        """Delete what :meth:`cleanup` moved aside, but for up to SPARES_MAX run directories kept
        for the next runs (:meth:`_keep_spare`) (blocking: the agent runs it in a thread);
        returns how many entries went."""
        gone = 0
        for entry in os.scandir(self.trash_dir) if self.trash_dir.is_dir() else ():
            if not self._keep_spare(entry):
                shutil.rmtree(entry.path, ignore_errors=True)
            gone += 1
        self._remove_cgroups_left()
        return gone

    def _keep_spare(self, entry: os.DirEntry) -> bool:
        """Keep trashed run directory ``entry`` as a spare for a later run (see _make_run_dir):
        its reserves, which must all be there, unused (the agent's own regular files of
        RESERVE_BYTES, one link each), and its other files as blanks for the next run's writes
        (statefile.py), moved to the spare folder. False (the caller deletes it) for anything
        else: a control directory, which its job could write, never qualifies, by name and as
        its reserves would be missing."""
        if len(self._spares) >= SPARES_MAX or not _TRASHED_RUN.match(entry.name):
            return False
        try:
            st = entry.stat(follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) != 0o700:
                return False
            wanted = {f"{name}{RESERVE_SUFFIX}" for name in RESERVED}
            found: set[str] = set()
            others: list[str] = []
            for f in os.scandir(entry.path):
                fst = f.stat(follow_symlinks=False)
                own = stat.S_ISREG(fst.st_mode) and fst.st_nlink == 1 and fst.st_uid == os.geteuid()
                if f.name in wanted and own and fst.st_size == RESERVE_BYTES:
                    found.add(f.name)
                elif stat.S_ISDIR(fst.st_mode):
                    return False
                elif own and f.name not in wanted:
                    others.append(f.name)
                else:
                    os.unlink(f.path)
            if found != wanted:
                return False
            slots = blank_names()
            free = [b for b in slots if b not in others]
            for name in others:
                if name in slots:
                    continue  # a blank the run did not use
                if free:
                    os.rename(os.path.join(entry.path, name), os.path.join(entry.path, free.pop(0)))
                else:
                    os.unlink(os.path.join(entry.path, name))
            self.spare_dir.mkdir(mode=0o700, exist_ok=True)
            spare = self.spare_dir / entry.name
            os.rename(entry.path, spare)
        except OSError:
            return False
        self._spares.append(spare)
        return True

    def _forget_cgroup(self, key: str) -> None:
        """Queue the cgroup of forgotten run ``key`` for removal by :meth:`empty_trash`, off the
        event loop. Its job's processes are gone (its launcher killed what was left in it before
        recording the exit); what may remain is the launcher's own end: its exit, which reaches
        the cgroup a moment after the agent saw it, and its child that fsyncs the exit status,
        which the report made moot."""
        c = self.containment
        if c is not None and c.cgroups.kind is not CgroupKind.NONE:
            self._cgroups_left.append(RunCgroup(c.cgroups.kind, c.cgroups.for_run(key)))

    def _remove_cgroups_left(self) -> None:
        """Empty and remove the cgroups of forgotten runs (blocking: in the trash's thread); one
        still busy past CGROUP_REMOVE_S holds a process that will not die, and is tried again in
        the next round. (An agent that stops in between leaves an empty folder behind, which the
        node's next agent removes as it starts: cgroup.remove_left.)"""
        deadline = time.monotonic() + CGROUP_REMOVE_S
        while self._cgroups_left:
            cg = self._cgroups_left.pop(0)
            cg.kill_all()
            if cg.remove():
                continue
            self._cgroups_left.append(cg)
            if time.monotonic() > deadline:
                return
            time.sleep(0.01)


def settle_exit(first: int | None, launcher_alive: bool, second: int | None) -> tuple[RunPhase, int | None]:
    """Pure: a run's phase and exit status from three observations made in this order: the exit
    status file (``first``), whether the launcher lives (only asked when ``first`` is None), and
    the exit status file again (``second``, only read when the launcher was seen gone).

    The launcher writes the status and then exits, so a status read after the launcher was seen
    gone is the final word: only when that read finds nothing either did the launcher die
    without recording the job's status (killed), which reads as SIGKILL. Deciding "killed" from
    the first read alone would record jobs that exited 0 as "exited with code -9" whenever the
    launcher wrote its status between the two looks."""
    if first is not None:
        return RunPhase.EXITED, first
    if launcher_alive:
        return RunPhase.ALIVE, None
    if second is not None:
        return RunPhase.EXITED, second
    return RunPhase.EXITED, -signal.SIGKILL


def fence_spec(fence_s: float, alive: Path, fence_poll_s: float) -> Fencing | None:
    """The launch spec's self-fencing part (see launcher.py); None (no fencing) unless the
    assignment asks for a finite positive bound."""
    if not (math.isfinite(fence_s) and fence_s > 0):
        return None
    return Fencing(alive=str(alive), fence_s=fence_s, kill_s=FENCE_KILL_FACTOR * fence_s, poll_s=fence_poll_s)


def _is_dev(ra: RunAssignment) -> bool:
    """A development session's run."""
    return ra.kind == JOB_DEV


def _mark_killed(path: Path) -> None:
    """Record that the agent sent SIGKILL (RunState.KILLED). Best effort, never in the way of the
    signal: unrecorded, the run reads as TERMINATED, whose kill window is over, so the next plan
    kills it again anyway."""
    try:
        touch(path)
    except OSError as e:
        log.warning("could not record the SIGKILL of %s: %s", path.parent.name, e)


def _read_hung(path: Path) -> float:
    """The watchdog time a hung run went past (its launcher's HUNG_FILE), 0.0 if it did not."""
    text = _read_text(path)
    try:
        return max(0.0, float(text.split()[0])) if text else 0.0
    except ValueError:
        return 0.0


def _warn_if_unreachable(path: Path) -> None:
    """Jobs run as their users and must pass through every parent of their control directory."""
    for parent in path.resolve().parents:
        if not parent.stat().st_mode & 0o001:
            log.warning("jobs of other users cannot reach %s: %s is not searchable by others (chmod o+x)",
                        path, parent)
            return


def _asks_to_stop(ack: bytes | None) -> bool:
    """Does the job's ack (``go_suspend``: "<pid> <time> exit|stop") ask to be stopped now? Anything
    else means the job exits by itself."""
    return ack is not None and ack.split()[2:3] == [b"stop"]


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read_text(path)
    try:
        return int(text) if text else None
    except ValueError:
        return None


def _read_usage(path: Path) -> RunUsage | None:
    """The usage its launcher recorded (the run directory is the agent's: trusted), None if none."""
    text = _read_text(path)
    if not text:
        return None
    try:
        raw = json.loads(text)
        return RunUsage(peak_bytes=int(raw.get("peak_bytes", 0)), cpu_s=float(raw.get("cpu_s", 0.0)),
                        oom_kills=int(raw.get("oom_kills", 0)), limit_bytes=int(raw.get("limit_bytes", 0)))
    except (ValueError, TypeError, AttributeError):
        return None
