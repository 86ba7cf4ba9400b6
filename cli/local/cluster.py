"""The local cluster: a whole cluster of real processes on this machine (``hfai local up|down|status``).

:class:`LocalCluster` puts together the layout and state file (hfai.cli.local.layout), the
nats-server (nats_server), the credentials (credentials) and the daemon processes (daemons), and
hands the running daemons to a supervisor (supervisor) that restarts the ones that die.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from hfai._atomic import write_atomic
from hfai._proc import pid_alive
from hfai.cli.local import daemons
from hfai.cli.local.credentials import Credentials
from hfai.cli.local.layout import LOCAL_AGENT, LOCAL_CONTROLLER, ClusterState, Layout, default_root
from hfai.cli.local.nats_server import MAX_PAYLOAD, NO_CONSUMER_CAP, start_nats
from hfai.cli.local.supervision import SupervisePolicy
from hfai.core.config import (
    AgentConfig,
    Config,
    ControllerConfig,
    NatsConfig,
    StorageConfig,
    WebConfig,
    dump_toml,
    load_config,
)
from hfai.protocol import names
from hfai.protocol.errors import HfaiError, Unavailable

log = logging.getLogger(__name__)

#: The names the user guide and old scripts give the cluster's stock environment
#: (``HF_ENV_NAME=py38-202111``, ``hf_env.set_env('202111')``): aliases of a local cluster's own.
GUIDE_ALIASES = ("py38-202111", "202111")


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
    # Where the daemons' /metrics listen: loopback, as everything else of a cluster on one machine
    # (a cluster's default, every interface, would show this machine's jobs to its whole network).
    metrics_host: str = "127.0.0.1"
    # The storage service's limits and periods (paths are always under the root); None: LOCAL_STORAGE.
    storage: StorageConfig | None = None
    # Restart daemons that die, and nats-server when its store breaks (hfai.cli.local.supervisor):
    # `hfai local up` does; None (tests of faults that must stay put): nothing is restarted.
    supervise: SupervisePolicy | None = None
    pids: dict[str, int] = field(default_factory=dict)
    # What the supervisor last wrote: its pid, each daemon's restarts, the store's health.
    supervision: dict = field(default_factory=dict)
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict, repr=False)
    _supervisor: subprocess.Popen | None = field(default=None, repr=False)

    @classmethod
    def default_root(cls) -> Path:
        return default_root()

    @property
    def layout(self) -> Layout:
        return Layout(self.root)

    @property
    def credentials(self) -> Credentials:
        return Credentials(self.layout)

    @property
    def config_path(self) -> Path:
        return self.layout.config_path

    @property
    def state_path(self) -> Path:
        return self.layout.state_path

    def node_name(self, i: int) -> str:
        return Layout.node_name(i)

    @property
    def creds_dir(self) -> Path:
        """Where this cluster's users keep their credentials (the CLI looks here)."""
        return self.layout.creds_dir

    def config(self) -> Config:
        return Config(
            nats=NatsConfig(url=self.url, replicas=self.replicas, creds_dir=str(self.creds_dir) if self.auth else "",
                            tls_ca=self.tls_ca),
            controller=dataclasses.replace(self.controller, metrics_host=self.metrics_host),
            agent=dataclasses.replace(self.agent, env_root=str(self.layout.envs), metrics_host=self.metrics_host,
                                      home_root=self.agent.home_root or str(self.layout.homes)),
            web=self.web or WebConfig(),
            storage=self.storage_config(),
        )

    def storage_config(self) -> StorageConfig:
        return self.layout.storage_config(self.storage)

    def register_base_env(self) -> None:
        """This interpreter (the one the agents run jobs with) as the cluster's base environment,
        named for the month it was first registered and aliased as the user guide's stock names,
        so that its ``HF_ENV_NAME=py38-202111 hfai python sample.py -- -n 1`` runs as written."""
        from hfai.storage import envs

        try:
            envs.register_local(str(self.layout.envs), sys.executable, time.strftime("%Y%m"), GUIDE_ALIASES)
        except HfaiError as e:  # a cluster without it still runs jobs in this interpreter
            log.warning("could not register %s as a base environment: %s", sys.executable, e)

    # ---------------------------------------------------------------------------- up/down

    def up(self, nats_url: str | None = None) -> list[str]:
        """Start NATS, the controllers and the agents. With ``nats_url`` (comma-separated servers)
        join those NATS servers instead of starting one; they are not stopped by :meth:`down`.
        Returns the nodes of an earlier cluster in this root that were forgotten (see
        :meth:`forget_nodes`)."""
        if self.is_up():
            raise HfaiError(f"a local cluster is already running under {self.root}; `hfai local down` first")
        layout = self.layout
        resumed = self.has_state
        layout.prepare()
        self.register_base_env()
        conf = None
        if self.auth:
            self.user_creds(self.owner or _login(), operator=True)
            if not nats_url:
                conf = layout.nats_conf
                conf.write_text(self.server_auth_config(layout.nats_store / "accounts") + NO_CONSUMER_CAP + MAX_PAYLOAD)
        if nats_url:
            self.url = nats_url
        else:
            proc, self.url = start_nats(layout.nats_store, layout.log_path("nats"), config_file=conf)
            self._procs["nats"] = proc
        write_atomic(self.config_path, dump_toml(self.config()))
        # Before any controller leads: at a takeover every known node gets a heartbeat window, so
        # a node of the last cluster that this one lacks would get work for that long.
        forgotten: list[str] = []
        if resumed and not nats_url:
            try:
                forgotten = self.forget_nodes()
            except BaseException:
                daemons.terminate(self._procs["nats"].pid, self._procs.pop("nats"))
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
        """Hand the running daemons over to a supervisor process (hfai.cli.local.supervisor): it
        starts once cluster.json names it, and is from then on that file's only writer."""
        from hfai.cli.local.supervisor import spawn

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
        daemons.terminate(pid, self._supervisor, grace_s=30.0)  # it may be in the middle of a restart
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
        return self.layout.has_state

    def reset(self) -> None:
        """Wipe the state an earlier cluster left here: jobs, nodes, agents' runs and logs, daemon
        logs, and every credential (the issuer too: files handed out before stop working). The
        environments under envs/ stay. Refused while the cluster runs."""
        if self.is_up():
            raise HfaiError(f"the local cluster under {self.root} is running: `hfai local down` first")
        daemons.kill_job_groups(self.layout.agents)  # anything a crashed cluster left running
        self.layout.wipe_state()

    def forget_nodes(self) -> list[str]:
        """Delete the node records and assignments of nodes this cluster does not have (an earlier
        ``up --nodes`` made more), with the controllers' credentials; returns their names. A job
        that still holds one is requeued by the leader once the node has had the heartbeat window
        every node gets at a takeover (controller.nodes.unknown_nodes)."""
        import asyncio

        import nats.js.errors

        from hfai.auth.roles import Role
        from hfai.core import nats as _nats

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
        restarted meanwhile; then every agent is asked to suspend all its runs (the agent's own
        interrupt, hfai.agent.operations): each live run gets its suspend flag (the job
        checkpoints and calls ``hfai.go_suspend()``), SIGTERM once the acknowledgement window
        passed (at once with ``now``) and SIGKILL after the kill window, and its exit is reported
        as an interruption, which the next leader applies: the jobs are requeued, keeping their
        whole-life state, and resume at the next ``up``. Returns the runs interrupted."""
        import asyncio

        from hfai.cli.local.interrupt import suspend_nodes

        self.stop_supervisor()  # or it would start the controllers again
        for name in [n for n in self.pids if n.startswith("controller")]:
            daemons.terminate(self.pids.get(name), self._procs.get(name))
            self.pids.pop(name, None)
        try:
            cc = load_config(self.config_path).controller
        except (HfaiError, OSError):
            cc = self.controller
        ack_s, kill_s = (0.0, min(2.0, cc.kill_window_s)) if now else (cc.ack_window_s, cc.kill_window_s)
        wait_s = timeout_s if timeout_s is not None else ack_s + 2 * kill_s + 25.0
        agents = {name.removeprefix("agent-"): pid for name, pid in self.pids.items() if name.startswith("agent-")}
        asked = [node for node, pid in agents.items() if pid_alive(pid)]
        owner = self.owner or _login()
        if self.auth:
            self.user_creds(owner, operator=True)  # asking the agents takes an operator's permissions
        done = asyncio.run(suspend_nodes(self.config(), owner, asked, ack_s, kill_s, wait_s, announce))
        # A dead agent cannot interrupt its runs, and the jobs would outlive the cluster: stop
        # them. Its runs' exits are reported by the next agent of that node (as killed).
        for node in sorted(set(agents) - set(asked) | set(done.silent)):
            daemons.kill_job_groups(self.layout.agents, node)
        return done.runs

    # ------------------------------------------------------------------------ credentials

    def issuer(self):
        return self.credentials.issuer()

    def server_auth_config(self, resolver_dir: Path) -> str:
        """The nats-server config block that makes a server trust this cluster's credentials."""
        return self.credentials.server_auth_config(resolver_dir)

    def user_creds(self, name: str, operator: bool = False) -> Path:
        """A user's credentials file in :attr:`creds_dir` (made on first use)."""
        return self.credentials.user(name, operator)

    def service_creds(self, name: str, role) -> Path:
        """A daemon's credentials, readable by the cluster's owner only."""
        return self.credentials.service(name, role)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Block until the API answers, every agent has registered, the storage service serves (a
        push made at once would otherwise find no one on its subject) and hfai-web, when it runs,
        takes connections (`hfai local up` prints its address)."""
        import asyncio

        from hfai.protocol import storage as s
        from hfai.storage.client import StorageClient

        async def web_listens() -> bool:
            if self.web is None or self.web.port <= 0:
                return True  # none, or on a port of its choosing that only its log names
            try:
                _r, w = await asyncio.wait_for(asyncio.open_connection(self.web.host, self.web.port), 1.0)
            except (OSError, TimeoutError):
                return False
            w.close()
            return True

        async def serving(client: StorageClient) -> bool:
            try:
                if len(await client.api.nodes()) < self.nodes:
                    return False
                await client.scall(s.WS_LIST, s.ListWorkspaces())  # a cheap verb
            except Unavailable:
                return False
            return await web_listens()

        async def poll() -> None:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            client = StorageClient(self.config(), user=self.owner or _login())
            async with client:
                while loop.time() < deadline:
                    if await serving(client):
                        return
                    await asyncio.sleep(0.1)
            raise Unavailable(f"the local cluster did not come up within {timeout_s:g}s; see {self.root}/logs")

        asyncio.run(poll())

    # -------------------------------------------------------------------------- daemons

    def _spawn(self, name: str, module: str, extra_env: dict[str, str], creds: Path | None) -> subprocess.Popen:
        proc = daemons.spawn(self.layout.log_path(name), module, daemons.daemon_env(self.config_path, creds, extra_env))
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
        return self.layout.metrics_file(name)

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
            "HFAI_AGENT_STATE_DIR": str(self.layout.agents / node),
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
        daemons.send(pid, self._procs.get(name), sig)

    def down(self, jobs_too: bool = True) -> None:
        """Stop the supervisor, then the daemons (graceful, then forceful), and by default the
        jobs they started."""
        self.stop_supervisor()
        if "nats" not in self.pids and self._procs.get("nats"):
            self.pids["nats"] = self._procs["nats"].pid
        order = [n for n in self.pids if n.startswith(("agent", "web", "storage"))] + \
                [n for n in self.pids if n.startswith("controller")] + ["nats"]
        for name in order:
            daemons.terminate(self.pids.get(name), self._procs.get(name))
        if jobs_too:
            daemons.kill_job_groups(self.layout.agents)
        self.state_path.unlink(missing_ok=True)

    # ------------------------------------------------------------------------------ state

    def save(self) -> None:
        self.pids["nats"] = self._procs["nats"].pid if "nats" in self._procs else self.pids.get("nats", 0)
        ClusterState(url=self.url, nodes=self.nodes, pids=self.pids, auth=self.auth, owner=self.owner or _login(),
                     supervision=self.supervision).write(self.root)

    @classmethod
    def load(cls, root: Path | None = None) -> LocalCluster | None:
        root = root or cls.default_root()
        state = ClusterState.read(root)
        if state is None:
            return None
        return cls(root=root, nodes=state.nodes, url=state.url, pids=state.pids, auth=state.auth, owner=state.owner,
                   supervision=state.supervision, web=_web_of(Layout(root), state))

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
        daemons_seen = self.supervision.get("daemons", {})
        lines = []
        for name, alive in self.alive().items():
            seen = daemons_seen.get(name, {})
            state = "running" if alive else ("dead (given up on)" if seen.get("gave_up") else "dead")
            if seen.get("restarts"):
                ago = time.time() - seen.get("last_restart", 0.0)
                state += f", restarted {seen['restarts']}x (last {ago:.0f}s ago"
                state += f"; how it ended: {seen['last_exit']})" if seen.get("last_exit") else ")"
            if name.startswith("agent-") and alive:
                contained = _read_containment(self.layout.agents / name.removeprefix("agent-"))
                if contained:
                    state += f"; jobs: {contained}"
            lines.append(f"  {name:<16} {state}")
        sup = self.supervision.get("pid")
        lines.append(f"  {'supervisor':<16} " + ("running" if pid_alive(sup) else
                                                 "dead: nothing restarts the daemons" if sup else "none"))
        store = self.supervision.get("store", {})
        if store and not store.get("writable", True):
            lines.append(f"  NATS store refuses writes: {store.get('detail', '')} (restarted when its disk has room)")
        return lines


def _read_containment(state_dir: Path) -> str:
    """How an agent contains its runs, as it wrote at start (agent/runs.py: CONTAINMENT_FILE)."""
    try:
        return (state_dir / "containment").read_text().strip()
    except OSError:
        return ""


def _web_of(layout: Layout, state: ClusterState) -> WebConfig | None:
    """The settings hfai-web of a running cluster was started with (what `up` wrote to the
    daemons' config), or None when it runs none. `hfai local status` prints its address: `up` may
    have taken another port than the usual one, which may then be someone else's hfai-web."""
    if "web" not in state.pids:
        return None
    try:
        return load_config(layout.config_path, env={}).web
    except (HfaiError, OSError):
        return None


def ghost_nodes(known, wanted) -> list[str]:
    """Pure: the nodes recorded by an earlier cluster that this one does not have."""
    return sorted(set(known) - set(wanted))


def _login() -> str:
    from hfai.api.config import current_user

    return current_user()
