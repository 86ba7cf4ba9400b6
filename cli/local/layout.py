"""Where a local cluster keeps everything under its root, its defaults, and its state file.

The root (``$HFAI_HOME/local``) holds the config the daemons read (``hfai.toml``), their logs,
the agents' state, the NATS store, the credentials and ``cluster.json`` (pids and URL), through
which the CLI finds the cluster (hfai.api.config reads the same file without this package).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from hfai._atomic import write_atomic
from hfai.api.config import LOCAL_CONFIG_FILE, LOCAL_STATE_FILE, local_root, read_local_state
from hfai.core.config import AgentConfig, ControllerConfig, StorageConfig

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

#: What ``reset`` wipes under the root (``envs/`` is the user's, not state).
STATE_DIRS = ("nats", "agents", "auth", "creds", "logs", "storage")
STATE_FILES = ("nats.conf", LOCAL_CONFIG_FILE, LOCAL_STATE_FILE)


def default_root() -> Path:
    return local_root()


@dataclass(frozen=True)
class Layout:
    """The paths of a local cluster rooted at ``root``."""

    root: Path

    @property
    def config_path(self) -> Path:
        return self.root / LOCAL_CONFIG_FILE

    @property
    def state_path(self) -> Path:
        return self.root / LOCAL_STATE_FILE

    @property
    def creds_dir(self) -> Path:
        """Where this cluster's users keep their credentials (the CLI looks here)."""
        return self.root / "creds"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def envs(self) -> Path:
        return self.root / "envs"

    @property
    def homes(self) -> Path:
        """Users' persistent homes: ``homes/<user>`` is a job's /home/<user> (compute containers)."""
        return self.root / "home"

    @property
    def agents(self) -> Path:
        """Each node's agent state (its runs, logs, fence) is ``agents/<node>``."""
        return self.root / "agents"

    @property
    def nats_store(self) -> Path:
        return self.root / "nats"

    @property
    def nats_conf(self) -> Path:
        return self.root / "nats.conf"

    @property
    def auth(self) -> Path:
        """The issuer's keys and the daemons' credentials."""
        return self.root / "auth"

    @staticmethod
    def node_name(i: int) -> str:
        return f"node-{i}"

    def log_path(self, daemon: str) -> Path:
        return self.logs / f"{daemon}.log"

    def metrics_file(self, name: str) -> Path:
        """Where daemon ``name`` writes the port of its /metrics (agents: in their state folder)."""
        if name.startswith("agent-"):
            return self.agents / name.removeprefix("agent-") / "metrics_port"
        return self.logs / f"{name}.metrics_port"

    def storage_config(self, base: StorageConfig | None) -> StorageConfig:
        """The storage service's settings, with every path under the root: workspaces, gc,
        datasets and its state (the "shared filesystem" of a one-machine cluster)."""
        return dataclasses.replace(base or LOCAL_STORAGE, workspace_root=str(self.root / "workspaces"),
                                   gc_root=str(self.root / "gc"), dataset_root=str(self.root / "datasets"),
                                   state_dir=str(self.root / "storage"))

    @property
    def has_state(self) -> bool:
        """Whether an earlier cluster left its state here (jobs, nodes) for ``up`` to resume."""
        return (self.nats_store / "jetstream").is_dir()

    def prepare(self) -> None:
        """The folders ``up`` needs, without the ports an earlier cluster's daemons wrote (each
        daemon writes its own anew)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.envs.mkdir(parents=True, exist_ok=True)
        for stale in [*self.logs.glob("*.metrics_port"), *self.agents.glob("*/metrics_port")]:
            stale.unlink(missing_ok=True)

    def wipe_state(self) -> None:
        for name in STATE_DIRS:
            shutil.rmtree(self.root / name, ignore_errors=True)
        for name in STATE_FILES:
            (self.root / name).unlink(missing_ok=True)


@dataclass
class ClusterState:
    """What ``cluster.json`` records of a running cluster: its NATS URL, the daemons' pids, and
    what the supervisor last wrote (its pid, each daemon's restarts, the store's health)."""

    url: str
    nodes: int = 0
    pids: dict[str, int] = field(default_factory=dict)
    auth: bool = True
    owner: str = ""
    supervision: dict = field(default_factory=dict)

    @classmethod
    def read(cls, root: Path) -> ClusterState | None:
        data = read_local_state(root)
        if data is None:
            return None
        return cls(url=data["url"], nodes=data.get("nodes", 0), pids=data.get("pids", {}),
                   auth=data.get("auth", True), owner=data.get("owner", ""),
                   supervision=data.get("supervision") or {})

    def write(self, root: Path) -> None:
        write_atomic(root / LOCAL_STATE_FILE, json.dumps(dataclasses.asdict(self), indent=1))
