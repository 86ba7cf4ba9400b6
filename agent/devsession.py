"""Development sessions on a node: the session's own process, and the agent's answer to hfai-web.

A session (``hfai dev start``, a job of kind ``dev``) runs ``python -m hfai.agent.devsession`` as
its user, like any job: :func:`main` makes the user's notebooks directory
(``<[dev] notebooks_root>/<user>/notebooks``, 0700), picks a free port on the node's address,
makes a token, writes the three to ``dev.json`` in the run's control directory (0600, the user's
and the agent's alone) and runs JupyterLab with them in its own process; the token reaches
JupyterLab in its environment, never on a command line that ``ps`` shows to the node's other users.
A JupyterLab that stopped itself after ``[dev] idle_s`` without activity ends the process with
:data:`~hfai.protocol.types.DEV_IDLE_EXIT`, so the controller records the session as stopped for
idleness rather than succeeded (:func:`run_lab`).

hfai-web proxies ``/dev/<job>/`` to that address: it asks the agent of the session's node on
``hfai.agent.<node>.dev`` (:class:`DevSessions`, only hfai-web and the controllers may publish
there), and the agent answers with ``dev.json`` of the run, if the run is the asking user's.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from hfai.protocol import decode, names
from hfai.protocol.errors import Forbidden, InvalidRequest
from hfai.protocol.types import DevSessionReply, DevSessionRequest

if TYPE_CHECKING:  # the session's own process and the CLI need none of the agent's machinery
    from hfai.agent.runs import RunStore

log = logging.getLogger(__name__)

#: In the run's control directory: where the session's JupyterLab listens, and its token.
DEV_FILE = "dev.json"
#: What a development session runs (the CLI submits it; "python" is the environment's python).
ENTRYPOINT = ("python", "-m", "hfai.agent.devsession")


def base_url(job_id: str) -> str:
    """The path JupyterLab serves under, the same one hfai-web proxies: ``/dev/<job>/``."""
    return f"/dev/{job_id}/"


def notebooks_dir(root: str, user: str, home: Path) -> Path:
    """``<root>/<user>/notebooks``; an empty root is ``<home>/jupyter`` (``$HFAI_HOME``)."""
    return Path(root or home / "jupyter") / names.check_token("user name", user) / "notebooks"


def jupyter_argv(python: str, address: str, port: int, job_id: str, root: Path, idle_s: float) -> list[str]:
    """JupyterLab's command line: no browser, one address and port (no retry on another port: the
    agent's reply names this one), served under :func:`base_url`, the notebooks as its root, and
    idle kernels, terminals and then the server itself ended after ``idle_s`` (0: never). The
    Host/Origin checks JupyterLab makes for a browser are off: only hfai-web talks to it, with
    the token."""
    argv = [python, "-m", "jupyterlab", "--no-browser", f"--ServerApp.ip={address}", f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0", f"--ServerApp.base_url={base_url(job_id)}",
            f"--ServerApp.root_dir={root}", "--ServerApp.allow_remote_access=True",
            "--ServerApp.allow_origin=*", "--ServerApp.password=",
            "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:  # a local cluster run as root runs its jobs as root: JupyterLab asks to be told
        argv.append("--allow-root")
    if idle_s > 0:
        idle = int(max(1, idle_s))
        argv += [f"--ServerApp.shutdown_no_activity_timeout={idle}",
                 f"--MappingKernelManager.cull_idle_timeout={idle}",
                 f"--MappingKernelManager.cull_interval={max(1, min(300, idle // 4))}",
                 f"--TerminalManager.cull_inactive_timeout={idle}",
                 f"--TerminalManager.cull_interval={max(1, min(300, idle // 4))}"]
    return argv


def free_port(address: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def main() -> None:
    """The session's process (a job's rank 0, run as its user): write ``dev.json``, exec JupyterLab."""
    from hfai._atomic import write_atomic
    from hfai.core.config import hfai_home, load_config

    env = os.environ
    job_id, user, control = env["HFAI_JOB_ID"], env["HFAI_USER"], env["HFAI_CONTROL_DIR"]
    config = load_config(None)
    # In a compute container the agent names the folder it bound there (the cluster's config is
    # not in the container).
    given = env.get("HFAI_NOTEBOOKS_DIR")
    root = Path(given) if given else notebooks_dir(config.dev.notebooks_root, user, hfai_home())
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    root.chmod(0o700)
    root.parent.chmod(0o700)
    # Bound to the node's cluster address (loopback on a local cluster), reached by hfai-web only.
    address = env.get("MASTER_ADDR") or "127.0.0.1"
    port = free_port(address)
    token = secrets.token_urlsafe(32)
    write_atomic(Path(control) / DEV_FILE, json.dumps({"address": address, "port": port, "token": token}), 0o600)
    env["JUPYTER_TOKEN"] = token
    env["JUPYTER_RUNTIME_DIR"] = str(Path(control) / "jupyter-runtime")
    # The session's terminals and `!hfai ...` in a notebook find the hfai of this environment.
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    print(f"hfai: development session {job_id} of {user}: JupyterLab on {address}:{port}, notebooks in {root}",
          flush=True)
    argv = jupyter_argv(sys.executable, address, port, job_id, root, config.dev.idle_s)
    sys.exit(run_lab(argv[3:]))


def run_lab(options: list[str]) -> int:
    """Run JupyterLab (``python -m jupyterlab OPTIONS``) in this process until its server stops;
    the exit status: :data:`~hfai.protocol.types.DEV_IDLE_EXIT` when the server stopped itself for
    inactivity, 0 for any other stop (a signal, File > Shut Down).

    Only jupyter_server's idle check (``shutdown_no_activity``, which stops the server once
    ``shutdown_no_activity_timeout`` passed without kernels, terminals or requests) counts: a stop
    called while that check runs is the idle one. Reading the server's log for its words would
    break with any rewording; its exit status is 0 for every stop."""
    from jupyter_server.serverapp import ServerApp
    from jupyterlab.labapp import LabApp  # type: ignore[import-untyped]

    from hfai.protocol.types import DEV_IDLE_EXIT

    idle = {"checking": False, "stopped": False}

    class SessionServer(ServerApp):
        def shutdown_no_activity(self) -> None:
            idle["checking"] = True
            try:
                super().shutdown_no_activity()
            finally:
                idle["checking"] = False

        def stop(self, from_signal: bool = False) -> None:
            if idle["checking"] and not from_signal:
                idle["stopped"] = True
            super().stop(from_signal)

    # LabApp itself, not a subclass: an extension app names its package from its class's module.
    LabApp.serverapp_class = SessionServer
    LabApp.launch_instance(options)
    return DEV_IDLE_EXIT if idle["stopped"] else 0


class DevSessions:
    """The agent's answer to hfai-web: where a session on this node listens (its ``dev.json``)."""

    def __init__(self, node: str, store: RunStore):
        self.node = node
        self.store = store

    async def serve(self, nc) -> None:
        await nc.subscribe(names.agent_dev_subject(self.node), cb=self._on_request)

    def lookup(self, req: DevSessionRequest) -> DevSessionReply:
        """The reply to ``req``: not ready while the run is not alive here or has not written its
        file; Forbidden for a run of another user."""
        from hfai.agent import safefs
        from hfai.agent.plan import RunPhase

        for key, run in self.store.snapshot().items():
            ra = run.assignment
            if ra.job_id != req.job_id or ra.rank != 0:
                continue
            if ra.user != req.user:
                raise Forbidden(f"session {req.job_id} is not {req.user}'s")
            if run.phase is not RunPhase.ALIVE:
                return DevSessionReply()
            raw = safefs.read_small(self.store.control_dir(key), DEV_FILE, limit=4096)
            try:
                found = json.loads(raw) if raw else None
                if not isinstance(found, dict):
                    return DevSessionReply()
                return DevSessionReply(ready=True, address=str(found["address"]), port=int(found["port"]),
                                       token=str(found["token"]))
            except (ValueError, KeyError, TypeError):
                return DevSessionReply()
        return DevSessionReply()

    async def _on_request(self, msg) -> None:
        from hfai.core.nats import answer  # here: the session's own process imports this module, not NATS

        async def dispatch(subject: str, data: bytes) -> DevSessionReply:
            if subject != names.agent_dev_subject(self.node):
                raise InvalidRequest(f"not this node's session subject: {subject[:200]}")
            return self.lookup(decode(data, DevSessionRequest))

        await answer(msg, dispatch, "agent")


if __name__ == "__main__":
    main()
