"""The local cluster's daemon processes: started detached (their own session, their log under
``logs/``), stopped gracefully then forcefully; and the last resort for jobs no agent stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from hfai._proc import pid_alive
from hfai.protocol.errors import Unavailable


def spawn(log_path: Path, module: str, env: dict[str, str]) -> subprocess.Popen:
    """``python -m module`` in a session of its own, appending to ``log_path``."""
    with open(log_path, "ab") as logf:
        return subprocess.Popen(
            [sys.executable, "-m", module], env=env, stdout=logf, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )


def daemon_env(config_path: Path, creds: Path | None, extra: dict[str, str]) -> dict[str, str]:
    """This process's environment for a daemon reading ``config_path`` with ``creds`` (never the
    invoking user's credentials)."""
    env = dict(os.environ, HFAI_CONFIG=str(config_path), **extra)
    env.pop("HFAI_NATS_CREDS", None)
    if creds is not None:
        env["HFAI_NATS_CREDS"] = str(creds)
    return env


def terminate(pid: int | None, proc: subprocess.Popen | None, grace_s: float = 10.0) -> None:
    """SIGTERM, and SIGKILL if it is still alive ``grace_s`` later."""
    if not pid or not pid_alive(pid):
        if proc is not None:
            proc.poll()
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc is not None:
        proc.wait()


def send(pid: int, proc: subprocess.Popen | None, sig: int) -> None:
    """Send ``sig`` and, for a child, wait for it to end (SIGKILL after 15 s)."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
    if proc is not None:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(pid, signal.SIGKILL)
            proc.wait()


def kill_job_groups(agents: Path, node: str = "*") -> None:
    """Kill every job (process group) and launcher still running under the state folder of
    ``node``'s agent (default: every agent's): what no agent is left to stop (a crashed cluster,
    a dead agent, a job that outlived its interrupt)."""
    for pidfile in agents.glob(f"{node}/runs/*/child_pid"):
        try:
            os.killpg(int(pidfile.read_text().strip()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError, OSError):
            pass
    for pidfile in agents.glob(f"{node}/runs/*/launcher_pid"):
        try:
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError, OSError, IndexError):
            pass


def free_port(host: str, preferred: int) -> int:
    """``preferred`` if nothing listens on it at ``host``, else a port the kernel says is free."""
    import socket

    for port in (preferred, 0):
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise Unavailable(f"no free TCP port on {host}")
