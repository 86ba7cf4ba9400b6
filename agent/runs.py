"""Runs on this node as directories and processes: start, signal, inspect, adopt, clean up.

Layout under ``state_dir``::

    runs/<job>.<run>/assignment      the RunAssignment (msgpack) this run was started from
    runs/<job>.<run>/control/        the job's control channel (suspend, ack, whole_life_state)
    runs/<job>.<run>/launcher_pid    pid and start time of the launcher
    runs/<job>.<run>/child_pid       the job's pid = its process group (written by the launcher)
    runs/<job>.<run>/exit_code       written by the launcher when the job exits
    runs/<job>.<run>/term            time the agent sent SIGTERM
    runs/<job>.<run>/<event>.sent    an event the leader has received (published and acked)
    logs/<job>/rank<r>.log           stdout+stderr of every run of the job on this node (appended)

Everything is a file, so an agent restarted while jobs run finds them all again (adoption).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from hfai._atomic import write_atomic
from hfai._job import ACK_FILE, SUSPEND_FILE, WHOLE_LIFE_FILE
from hfai.agent.plan import LocalRun, RunPhase
from hfai.protocol import decode, encode
from hfai.protocol.errors import HfaiError, ProtocolError
from hfai.protocol.types import RunAssignment, RunEventKind

log = logging.getLogger(__name__)


class StartError(HfaiError):
    """The run cannot start on this node (unknown environment, missing workdir, ...)."""


class RunStore:
    def __init__(self, state_dir: str | os.PathLike, node: str, env_root: str | os.PathLike):
        self.root = Path(state_dir)
        self.runs_dir = self.root / "runs"
        self.logs_dir = self.root / "logs"
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.node = node
        self.env_root = Path(env_root)
        self._children: dict[str, subprocess.Popen] = {}

    # ------------------------------------------------------------------------------ inspect

    def dir(self, key: str) -> Path:
        return self.runs_dir / key

    def log_path(self, job_id: str, rank: int) -> Path:
        return self.logs_dir / job_id / f"rank{rank}.log"

    def environments(self) -> tuple[str, ...]:
        if not self.env_root.is_dir():
            return ()
        return tuple(sorted(p.name for p in self.env_root.iterdir() if (p / "bin").is_dir()))

    def snapshot(self) -> dict[str, LocalRun]:
        """Every run directory on the node, with its current phase."""
        for popen in list(self._children.values()):
            popen.poll()  # reap launchers we started, so they do not linger as zombies
        out = {}
        for d in sorted(self.runs_dir.iterdir()) if self.runs_dir.is_dir() else ():
            try:
                out[d.name] = self._load(d)
            except (OSError, ProtocolError) as e:
                log.warning("ignoring unreadable run directory %s: %s", d, e)
        return out

    def _load(self, d: Path) -> LocalRun:
        ra = decode((d / "assignment").read_bytes(), RunAssignment)
        exit_code = _read_int(d / "exit_code")
        phase = RunPhase.EXITED
        if exit_code is None:
            if self._launcher_alive(d):
                phase = RunPhase.ALIVE
            else:
                exit_code = -signal.SIGKILL  # the launcher died without recording the job's status
        suspend = d / "control" / SUSPEND_FILE
        ack = d / "control" / ACK_FILE
        ack_ts = ack.stat().st_mtime if ack.exists() else None
        return LocalRun(
            key=d.name, assignment=ra, phase=phase, exit_code=exit_code,
            suspend_ts=suspend.stat().st_mtime if suspend.exists() else None,
            acked=ack_ts is not None,
            ack_ts=ack_ts,
            term_ts=_read_float(d / "term"),
            sent=frozenset(k for k in RunEventKind if (d / f"{k.value}.sent").exists()),
        )

    def _launcher_alive(self, d: Path) -> bool:
        text = _read_text(d / "launcher_pid")
        if text is None:
            return False
        pid_s, _, created_s = text.partition(" ")
        try:
            proc = psutil.Process(int(pid_s))
            # A recycled pid belongs to a process created at another time.
            return proc.status() != psutil.STATUS_ZOMBIE and abs(proc.create_time() - float(created_s)) < 1.0
        except (psutil.Error, ValueError):
            return False

    def whole_life_state(self, key: str) -> int | None:
        return _read_int(self.dir(key) / "control" / WHOLE_LIFE_FILE)

    # -------------------------------------------------------------------------------- act

    def start(self, ra: RunAssignment) -> subprocess.Popen:
        """Create the run directory and launch the job; raises StartError if it cannot run here."""
        d = self.dir(ra.key)
        d.mkdir(parents=True)
        (d / "control").mkdir()
        write_atomic(d / "assignment", encode(ra))
        try:
            argv, env = self._command(ra, d)
        except StartError as e:
            write_atomic(d / "exit_code", b"127\n")
            write_atomic(d / "start_error", str(e).encode())
            raise
        logf = self.log_path(ra.job_id, ra.rank)
        logf.parent.mkdir(parents=True, exist_ok=True)
        with open(logf, "ab") as f:
            f.write(f"=== hfai: job {ra.name} ({ra.job_id}) run {ra.run_id}, suspend count {ra.suspend_count}, "
                    f"rank {ra.rank}/{ra.world_size} on {self.node} at {time.strftime('%H:%M:%S')} ===\n".encode())
        popen = subprocess.Popen(
            [sys.executable, "-m", "hfai.agent.launcher", str(d), str(logf), "--", *argv],
            cwd=ra.workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )
        self._children[ra.key] = popen
        created = psutil.Process(popen.pid).create_time()
        write_atomic(d / "launcher_pid", f"{popen.pid} {created}".encode())
        return popen

    def _command(self, ra: RunAssignment, d: Path) -> tuple[list[str], dict[str, str]]:
        if not os.path.isdir(ra.workdir):
            raise StartError(f"workdir {ra.workdir} does not exist on node {self.node}")
        env = dict(os.environ)
        env.update(ra.env)
        python = sys.executable
        if ra.env_name:
            env_dir = self.env_root / ra.env_name
            if not (env_dir / "bin").is_dir():
                raise StartError(f"unknown environment HF_ENV_NAME={ra.env_name!r} on node {self.node} "
                                 f"(looked for {env_dir}/bin)")
            env["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
            env["VIRTUAL_ENV"] = str(env_dir)
            python = str(env_dir / "bin" / "python")
        env.update(job_environment(ra, self.node, str(d / "control")))
        argv = list(ra.entrypoint)
        if argv[0] in ("python", "python3"):
            argv[0] = python
        return argv, env

    def raise_suspend(self, key: str) -> None:
        write_atomic(self.dir(key) / "control" / SUSPEND_FILE, f"{time.time()}\n".encode())

    def signal(self, key: str, sig: int) -> None:
        d = self.dir(key)
        if sig == signal.SIGTERM and not (d / "term").exists():
            write_atomic(d / "term", f"{time.time()}\n".encode())
        pgid = _read_int(d / "child_pid")
        if pgid is None:
            # The launcher has not started the job yet: stop the launcher itself.
            pid_s = (_read_text(d / "launcher_pid") or "").partition(" ")[0]
            pgid = int(pid_s) if pid_s.isdigit() else None
        if pgid is None:
            return
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def mark_sent(self, key: str, kind: RunEventKind) -> None:
        write_atomic(self.dir(key) / f"{kind.value}.sent", b"")

    def record_never_ran(self, ra: RunAssignment) -> None:
        d = self.dir(ra.key)
        (d / "control").mkdir(parents=True, exist_ok=True)
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
        shutil.rmtree(self.logs_dir / job_id, ignore_errors=True)

    def cleanup(self, key: str) -> None:
        self._children.pop(key, None)
        shutil.rmtree(self.dir(key), ignore_errors=True)


def job_environment(ra: RunAssignment, node: str, control_dir: str) -> dict[str, str]:
    """The variables a job sees: torch's names, HFAI_* and the MARSV2_* names hfai scripts read."""
    env = {
        "WORLD_SIZE": str(ra.world_size),
        "RANK": str(ra.rank),
        "MASTER_ADDR": ra.master_addr,
        "MASTER_PORT": str(ra.master_port),
        "HFAI_JOB_ID": ra.job_id,
        "HFAI_CHAIN_ID": ra.job_id,
        "HFAI_RUN_ID": str(ra.run_id),
        "HFAI_JOB_NAME": ra.name,
        "HFAI_USER": ra.user,
        "HFAI_GROUP": ra.group,
        "HFAI_PRIORITY": str(ra.priority),
        "HFAI_NODE": node,
        "HFAI_SUSPEND_COUNT": str(ra.suspend_count),
        "HFAI_WHOLE_LIFE_STATE": str(ra.whole_life_state),
        "HFAI_CONTROL_DIR": control_dir,
        "HF_ENV_NAME": ra.env_name,
        "MARSV2_RANK": str(ra.rank),
        "MARSV2_WORLD_SIZE": str(ra.world_size),
        "MARSV2_NB_ID": ra.job_id,
        "MARSV2_NB_NAME": ra.name,
        "MARSV2_USER": ra.user,
        "MARSV2_NODE_NAME": node,
        "MARSV2_WHOLE_LIFE_STATE": str(ra.whole_life_state),
        "MARSV2_SUSPEND_COUNT": str(ra.suspend_count),
        "PYTHONUNBUFFERED": "1",
    }
    return env


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


def _read_float(path: Path) -> float | None:
    text = _read_text(path)
    try:
        return float(text) if text else None
    except ValueError:
        return None
