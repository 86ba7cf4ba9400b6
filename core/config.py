"""Configuration of the platform daemons and the CLI: one TOML file plus environment overrides.

The file is ``$HFAI_CONFIG`` if set, else ``/etc/hfai/hfai.toml`` if it exists, else defaults.
Any field can be overridden by ``HFAI_<SECTION>_<FIELD>`` (e.g. ``HFAI_CONTROLLER_SLICE_S=600``,
``HFAI_AGENT_NODE=gpu-17``, ``HFAI_NATS_URL=nats://10.0.0.5:4222``). Every timeout, period and
window lives here so that tests can run the whole interrupt cycle in seconds.

The config and its sections are frozen dataclasses made at their first use
(``hfai.protocol._lazy``): :func:`load_config` fills them in without making any (a CLI call reads
``[nats]`` alone, and making a dataclass costs about a millisecond: ``dataclasses`` compiles its
methods).
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from hfai.protocol._lazy import fields as section_fields
from hfai.protocol._lazy import frozen_dataclass
from hfai.protocol.errors import InvalidRequest

DEFAULT_CONFIG_PATH = Path("/etc/hfai/hfai.toml")


def hfai_home(env: Mapping[str, str] = os.environ) -> Path:
    """Where local state lives (``$HFAI_HOME``, default ``~/.hfai``)."""
    return Path(env.get("HFAI_HOME") or Path.home() / ".hfai")


@frozen_dataclass
class NatsConfig:
    url: str = "nats://127.0.0.1:4222"
    connect_timeout_s: float = 2.0
    request_timeout_s: float = 5.0
    # A request that is safe to repeat (reads and idempotent changes, see hfai.api.client) is sent
    # again, alongside the copies still waiting, when none answered within this long: the API
    # replicas share a queue group, so a hung replica would otherwise fail its share of the calls
    # for as long as it hangs. Every try ends at request_timeout_s. 0: one try.
    request_try_s: float = 1.0
    # At most this many copies of one such request; each retry doubles the copies sent so far.
    request_copies: int = 16
    # A daemon retries creating buckets/streams after this long at first (then longer, jittered, up
    # to 10 s) while JetStream is not ready.
    setup_retry_s: float = 1.0
    # Replicas of KV buckets and streams: 1 on a single server, 3 on a production cluster.
    replicas: int = 1
    # This process's NATS credentials file (a daemon's, or a user's). Empty: the CLI looks for
    # <creds_dir>/<user>.creds, where creds_dir defaults to $HFAI_HOME/creds.
    creds: str = ""
    creds_dir: str = ""
    # CA certificate (PEM) that signed the servers' TLS certificates; set: connect with TLS.
    tls_ca: str = ""
    # A daemon asks its server's JetStream (the nodes bucket's stream info) this often, each
    # question given cutoff_timeout_s; one whose stream leader heard from no quorum of replicas
    # within cutoff_silent_s counts as unanswered. None answered for cutoff_after_s means the
    # server is cut off from its cluster: the daemon reconnects to another server and tries that
    # one last for cutoff_avoid_s (core/cutoff.py). cutoff_check_s 0: no checks.
    cutoff_check_s: float = 1.0
    cutoff_timeout_s: float = 1.0
    cutoff_silent_s: float = 3.0
    cutoff_after_s: float = 4.0
    cutoff_avoid_s: float = 30.0


@frozen_dataclass
class ControllerConfig:
    id: str = ""
    lease_ttl_s: float = 10.0
    # A standby tries to take the lease this often.
    lease_poll_s: float = 0.5
    schedule_interval_s: float = 1.0
    # Time slice among equal priorities: a running job older than this may yield to a waiting one.
    slice_s: float = 1800.0
    # The scheduling policy: "hfai-gain" sizes elastic jobs by the throughput they were measured
    # to gain from a node (docs/scheduling.md, "Elastic jobs"), "hfai" as if every job scaled
    # linearly. A resize must pay for its restart over the coming slice: the job's measured
    # restart, else resize_cost_s.
    policy: str = "hfai-gain"
    resize_cost_s: float = 120.0
    # Interrupt protocol windows, carried in every assignment to the agents.
    ack_window_s: float = 60.0
    kill_window_s: float = 30.0
    # A node whose heartbeat is older than this is DOWN and its jobs are requeued.
    heartbeat_timeout_s: float = 30.0
    # Event delivery: unacked events are redelivered to the (next) leader after this.
    event_ack_wait_s: float = 10.0
    # Fetches quiet this long while the consumer reports pending events: renew the subscription.
    event_stall_s: float = 3.0
    # MASTER_PORT of each run comes from [base, base + span): below Linux's default range of
    # ephemeral ports (32768-60999), so that a job's rendezvous port is never the local port of
    # some outgoing connection on its node (its bind would fail: address already in use).
    master_port_base: int = 20000
    master_port_span: int = 12768
    # ABOVE_NORMAL counts as NORMAL once a job has run this long in total (0: never).
    above_normal_s: float = 0.0
    # A log request relayed to an agent gives up after this long.
    log_request_timeout_s: float = 5.0
    # Finished jobs are forgotten (record deleted) this long after they ended (0: never), checked
    # by the leader every gc_interval_s.
    finished_retention_s: float = 30 * 86400.0
    gc_interval_s: float = 600.0
    # Largest list/nodes reply (encoded bytes); clients page past it. NATS refuses messages above
    # its max_payload (1 MiB by default), so keep this well under that.
    api_reply_bytes: int = 512 * 1024
    # Watchdog of the leader loop. The lease is renewed only while the loop showed
    # progress within leader_stall_s; past it the holder releases the lease for a standby. A loop
    # stuck for leader_exit_s (or tasks that ignore cancellation for cancel_timeout_s) makes the
    # controller exit non-zero, for systemd to restart it; shutdown_timeout_s bounds a clean stop.
    leader_stall_s: float = 15.0
    leader_exit_s: float = 45.0
    cancel_timeout_s: float = 10.0
    shutdown_timeout_s: float = 30.0
    # A waiting job's reason is written to its record only when its gist changes, and at most
    # this often per job: rewriting every round's wording would cost hundreds of writes per job.
    wait_reason_interval_s: float = 30.0
    # Working out why every waiting job waits costs O(queue): rounds between do only what changes
    # something (controller/plan.py), and one round this often also explains (and when a job waits
    # with no reason yet, but not more often than explain_new_interval_s: under a steady stream
    # of submissions every round would otherwise explain).
    explain_interval_s: float = 2.0
    explain_new_interval_s: float = 0.25
    # Prometheus /metrics on this port (0: off; -1: any free port, written to the log and, if set, to
    # metrics_port_file, where `hfai local status` finds it).
    metrics_port: int = 0
    metrics_port_file: str = ""
    # The address /metrics listens on: every interface, for a Prometheus elsewhere to scrape; a
    # local cluster binds loopback (hfai.cli.local), where nobody else on the network may read it.
    metrics_host: str = "0.0.0.0"
    # Runs that ended are copied to the usage bucket (GPU-hours outlive purged job records) this often.
    usage_interval_s: float = 10.0
    # The NATS store's health probe (controller/store_health.py): a write to the hfai_health
    # bucket this often, each given store_probe_timeout_s; store_probe_failures failed in a row
    # mean the store refuses writes (`hfai nodes` says so, hfai_nats_store_writable is 0).
    store_probe_s: float = 5.0
    store_probe_timeout_s: float = 5.0
    store_probe_failures: int = 3
    # This host's clock against the NATS server's (controller/clockcheck.py): measured this often;
    # more than clock_skew_alarm_s apart raises the alarm (hfai_controller_clock_skewed), and the
    # leader forgets no finished job until they agree (or while no measurement is fresh).
    clock_check_s: float = 30.0
    clock_skew_alarm_s: float = 5.0
    # --retry: a job whose run failed waits retry_backoff_s before its first retry, twice as long
    # before each further one, at most retry_backoff_max_s.
    retry_backoff_s: float = 30.0
    retry_backoff_max_s: float = 600.0
    # Priority levels above this one need a quota (no quota: 0 nodes) except for operators' jobs;
    # 10 = NORMAL. 50 (EXTREME_HIGH) opens every level to everyone (no quota: no limit).
    quota_needed_above: int = 10


@frozen_dataclass
class AgentConfig:
    node: str = ""
    group: str = "default"
    # Address other nodes use to reach this one (MASTER_ADDR of jobs whose rank 0 runs here).
    address: str = ""
    heartbeat_interval_s: float = 5.0
    reconcile_interval_s: float = 0.5
    # This many failed reconcile rounds in a row on local errors (disk full, read-only, ...) stop
    # the agent, for systemd to restart it (0: never).
    reconcile_failures_max: int = 20
    # "auto" (NVML if present, else simulated), "nvml" or "sim".
    gpu_source: str = "auto"
    sim_gpus: int = 8
    state_dir: str = "/var/lib/hfai/agent"
    # HF_ENV_NAME=<name> runs the job in a base environment of that name or alias (the operators'
    # table <env_root>/.base-envs.json: hfai env base add), else with <env_root>/<name>/bin first
    # on PATH (a user's, hfai env create). On the shared filesystem; sticky, as /tmp.
    env_root: str = "/opt/hfai/envs"
    # A job that acknowledged a suspend normally exits by itself (go_suspend() exits); after this
    # long it gets SIGTERM. Seconds: a job with spawned workers acks before its workers and then
    # its parent have finished. go_suspend(exit=False) asks to be stopped at once.
    ack_exit_grace_s: float = 15.0
    # Job logs on this node are deleted this long after their last write, unless the job still
    # has a run here (0: keep forever); checked every log_gc_interval_s.
    log_retention_s: float = 30 * 86400.0
    log_gc_interval_s: float = 3600.0
    # As whom jobs run: "submitter" (the Unix account named like the job's hfai user; the agent
    # must be root to run other users' jobs) or "agent" (the agent's own account: only for a
    # personal or test cluster, never a shared one). See agent/identity.py.
    run_as: str = "submitter"
    # Self-fencing: each run's launcher checks this often whether the agent's last accepted
    # heartbeat is older than the bound the leader sets (0.6 of its heartbeat_timeout_s), and then
    # stops the job. Capped at an eighth of the bound (see agent/launcher.py).
    fence_poll_s: float = 0.5
    # The log watchdog (agent/watchdog.py, docs/health.md): a run that writes no output for
    # watchdog_s (a job's own HF_WATCHDOG_TIME or hfai.set_watchdog_time first; 0: none by
    # default) is ended as hung, after its processes' Python stacks are written into its log,
    # which may take watchdog_dump_s; its launcher looks every watchdog_poll_s.
    watchdog_s: float = 1800.0
    watchdog_poll_s: float = 1.0
    watchdog_dump_s: float = 10.0
    # Each run's measured throughput (hfai._throughput) goes to the leader at most this often
    # (seconds; negative: never), for the scheduler's elastic sizing (docs/scheduling.md).
    throughput_relay_s: float = 15.0
    # Prometheus /metrics on this port (0: off; -1: any free port, written to <state_dir>/metrics_port),
    # on this address (a local cluster: loopback, as [controller] metrics_host).
    metrics_port: int = 0
    metrics_host: str = "0.0.0.0"
    # How runs' launchers start: "fork" (from one pre-imported process, about a millisecond) or
    # "exec" (a fresh interpreter per run, its start and imports each time); see agent/zygote.py. A fork that
    # fails or gets no answer within launcher_reply_timeout_s falls back to exec.
    launcher: str = "fork"
    launcher_reply_timeout_s: float = 5.0
    # A run keeps at most this many bytes of its output in its log on the node: the first quarter
    # and the latest, with a line saying how much was dropped between (0: no cap; else >= 64 KiB).
    log_cap_bytes: int = 64 * 1024 * 1024
    # With less free than this in state_dir's filesystem (or a write there refused for space) the
    # agent drains its node itself, saying why; it takes work again once 1.5 times this is free.
    state_min_free_bytes: int = 64 * 1024 * 1024
    # Node health (agent/health.py, docs/health.md): the GPUs' Xid events and polled conditions
    # are read this often (a fault is detected within one interval); the node validator runs at
    # agent start (health_check_on_start), on `hfai admin validate`, and every
    # health_check_idle_s while no job runs on the node (0: not), each step at most
    # health_check_step_s.
    health_interval_s: float = 10.0
    health_check_on_start: bool = True
    health_check_idle_s: float = 0.0
    health_check_step_s: float = 60.0
    # The validator's in-node all-reduce through hfreduce (agent/health_allreduce.py): "gpus" (on
    # real GPUs with torch, one process per GPU), "always" (simulated GPUs too: two processes over
    # CPU tensors, seconds of torch start-up at every agent start) or "never"; it fails below
    # health_allreduce_floor_gbps of bus bandwidth (nccl-tests' measure), all-reducing
    # health_allreduce_bytes.
    health_allreduce: str = "gpus"
    health_allreduce_floor_gbps: float = 1.0
    health_allreduce_bytes: int = 64 * 2**20
    # hfai exec / hfai shell (agent/exec.py): a session whose caller sent nothing for exec_idle_s
    # is killed (the caller sends something every third of it); after the command exits its
    # output is read for up to exec_drain_s more (a background process may hold it open); output
    # goes in chunks of at most exec_chunk_bytes (below NATS's max_payload), at most exec_window
    # of them unacknowledged; every exec_poll_s the agent kills what sessions left of runs that ended.
    exec_idle_s: float = 30.0
    exec_drain_s: float = 0.5
    exec_chunk_bytes: int = 64 * 1024
    exec_window: int = 64
    exec_poll_s: float = 1.0
    # Compute containers (agent/contain.py, docs/security.md): "bwrap" (a container per run) or
    # "none". A node that runs jobs as their submitters refuses "none", and a bwrap that cannot
    # work there, unless allow_uncontained is set.
    container: str = "bwrap"
    allow_uncontained: bool = False
    # The private /tmp and /dev/shm of a container (tmpfs; bytes, 0: the kernel's default, half
    # the node's memory; a tmpfs takes memory only as it is filled).
    container_tmp_bytes: int = 0
    container_shm_bytes: int = 0
    # <home_root>/<user> is bound at /home/<user> in the container ("": the account's own home
    # when jobs run as their submitters, else an empty one).
    home_root: str = ""
    # A cgroup per run (agent/cgroup.py): <cgroup fs>/<controller>/<cgroup_name>/<node>/<run>.
    cgroups: bool = True
    cgroup_name: str = "hfai"
    # Each run's memory limit: run_memory_bytes, or (0) the node's memory less memory_reserve_bytes
    # that the agent keeps for itself and the system; and its limit on processes and threads.
    run_memory_bytes: int = 0
    memory_reserve_bytes: int = 4 * 2**30
    run_pids_max: int = 65536

    def resolved_node(self) -> str:
        return self.node or socket.gethostname().split(".")[0]


@frozen_dataclass
class WebConfig:
    """``hfai-web``, the task-management pages (see docs/web.md)."""

    host: str = "127.0.0.1"
    port: int = 8470
    # A signed-in browser session is forgotten after this long without a request.
    session_idle_s: float = 8 * 3600.0
    # How often idle sessions are closed (their NATS connection and credentials file).
    session_sweep_s: float = 60.0
    # Signed-in sessions one user may hold at once; signing in once more ends their oldest.
    sessions_per_user: int = 16
    # How far back node telemetry is kept in the NATS stream HFAI_TELEMETRY (and shown).
    telemetry_max_age_s: float = 3600.0
    # The pages poll their JSON this often.
    poll_s: float = 2.0


@frozen_dataclass
class StorageConfig:
    """The storage service (hfai-storage): workspaces, storage rules, datasets (see docs/storage.md)."""

    # On the nodes' shared filesystem: <workspace_root>/<user>/<workspace> (jobs run there), files
    # moved by GC under <gc_root>/<user>/<stamp>/, datasets at <dataset_root>/<name> (HFAI_DATASETS_DIR).
    workspace_root: str = "/mnt/hfai/workspaces"
    gc_root: str = "/mnt/hfai/gc"
    dataset_root: str = "/mnt/hfai/datasets"
    # The service's own state (workspace manifests); root only.
    state_dir: str = "/var/lib/hfai/storage"
    # Workspace files are cut into chunks of this size (content-hashed); a put or fetch carries at
    # most request_bytes of chunks, and never more than the NATS server's max_payload allows (the
    # client reads it when it connects: a server left at NATS's 1 MiB default gets one chunk a
    # request). Fewer, larger requests are most of a large push's speed (docs/storage.md), hence
    # 8 MiB max_payload in the local cluster and systemd/nats.conf.example.
    chunk_bytes: int = 512 * 1024
    request_bytes: int = 4 * 1024 * 1024
    # Staged chunks of a push nobody committed are dropped after this long.
    staging_ttl_s: float = 86400.0
    # How long the CLI waits for a commit (the service writes the whole workspace before replying).
    commit_timeout_s: float = 600.0
    # Storage rules: a user whose workspaces hold more than limit_bytes is restricted (checked
    # every scan_interval_s); files untouched for gc_age_s move to gc_root, and gc entries are
    # deleted gc_keep_s after they moved (checked every gc_interval_s).
    limit_bytes: int = 5 * 10**12
    scan_interval_s: float = 86400.0
    gc_interval_s: float = 86400.0
    gc_age_s: float = 7 * 86400.0
    gc_keep_s: float = 7 * 86400.0
    shutdown_timeout_s: float = 30.0


@frozen_dataclass
class DevConfig:
    """Development sessions (``hfai dev``, docs/dev.md)."""

    # On the shared filesystem: <notebooks_root>/<user>/notebooks is a session's root (0700);
    # "" is $HFAI_HOME/jupyter of the user the session runs as.
    notebooks_root: str = ""
    # Sessions a user may have queued or running at once (the controller refuses more at submit).
    max_per_user: int = 1
    # A session without a request, kernel activity or terminal for this long ends itself
    # (JupyterLab's own culling; 0: never).
    idle_s: float = 4 * 3600.0


@frozen_dataclass  # made at first use (hfai.protocol._lazy), like its sections: a CLI call makes none
class Config:
    nats: NatsConfig = field(default_factory=NatsConfig)
    controller: ControllerConfig = field(default_factory=ControllerConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    web: WebConfig = field(default_factory=WebConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    dev: DevConfig = field(default_factory=DevConfig)


_SECTIONS = {"nats": NatsConfig, "controller": ControllerConfig, "agent": AgentConfig, "web": WebConfig,
             "storage": StorageConfig, "dev": DevConfig}


def config_file(env: Mapping[str, str] = os.environ) -> str | os.PathLike | None:
    """The config file when none is named: ``$HFAI_CONFIG`` if set, else ``/etc/hfai/hfai.toml``
    if it exists, else None (defaults; the CLI then looks for a running ``hfai local`` cluster)."""
    return env.get("HFAI_CONFIG") or (DEFAULT_CONFIG_PATH if DEFAULT_CONFIG_PATH.exists() else None)


def load_config(path: str | os.PathLike | None = None, env: Mapping[str, str] = os.environ) -> Config:
    """Read the TOML file (``path``, else :func:`config_file`) and apply ``HFAI_<SECTION>_<FIELD>``
    overrides."""
    if path is None:
        path = config_file(env)
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            raise InvalidRequest(f"config file {path} does not exist") from None
        simple = read_simple_toml(text)
        if simple is not None:
            data = simple
        else:
            import tomllib  # only for a file read_simple_toml leaves to it

            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as e:
                raise InvalidRequest(f"config file {path} is not valid TOML: {e}") from None
    overridden = {key.split("_", 2)[1].lower() for key in env if key.startswith("HFAI_") and key.count("_") >= 2}
    # Every section the file or the environment sets is checked now. Sections, like the Config,
    # are filled in without making their dataclasses (hfai.protocol._lazy: a CLI call makes
    # none, and a local cluster's file sets all six); section_fields reads their fields.
    sections: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        if name not in data and name not in overridden:
            continue
        values = dict(data.get(name, {}))
        unknown = set(values) - _field_types(cls).keys()
        if unknown:
            raise InvalidRequest(f"config [{name}] has unknown keys: {', '.join(sorted(unknown))}")
        for f in section_fields(cls):
            raw = env.get(f"HFAI_{name.upper()}_{f.name.upper()}")
            if raw is not None:
                values[f.name] = raw
        sections[name] = cls(**{k: _coerce(cls, k, v) for k, v in values.items()})
    return Config(**sections)


def read_simple_toml(text: str) -> dict[str, dict[str, Any]] | None:
    """What ``tomllib.loads(text)`` returns for a file in the TOML that :func:`dump_toml` writes
    (tables of bare keys, each a plain string without escapes, a decimal integer or a float;
    comments on lines of their own), or None for any other text, valid or not, which is left to
    tomllib. Every config file a local cluster writes is such a file, and tomllib's import is 2-3
    ms of each CLI call (its parse 1 more; a regular expression for these lines, 0.5 to compile)."""
    data: dict[str, dict[str, Any]] = {}
    table: dict[str, Any] | None = None
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if line.endswith("\r") and i < len(lines) - 1:
            line = line[:-1]  # TOML's newlines: LF and CRLF (a CR that ends the text is neither)
        line = line.strip(" \t")  # TOML's whitespace: space and tab
        if not line:
            continue
        if line[0] == "#":
            if not line.replace("\t", "").isprintable():
                return None  # a control character: tomllib's error
            continue
        if line[0] == "[":
            name = line[1:-1]
            if line[-1] != "]" or not _bare_key(name) or name in data:
                return None  # not a plain table, or one defined twice (tomllib's error)
            table = data[name] = {}
            continue
        key, eq, raw = line.partition("=")
        key, raw = key.rstrip(" \t"), raw.lstrip(" \t")
        if not eq or table is None or not _bare_key(key) or key in table:
            return None  # a key outside any table, or twice
        value = _simple_value(raw)
        if value is None:
            return None
        table[key] = value
    return data


def _bare_key(key: str) -> bool:
    return key.isascii() and key.replace("_", "a").replace("-", "a").isalnum()


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _simple_value(raw: str) -> str | int | float | None:
    """A basic string without escapes, a boolean, a decimal integer or a float (no underscores,
    inf nor nan) as TOML reads it, or None for anything else."""
    if raw in ("true", "false"):
        return raw == "true"
    if raw[:1] == '"':
        inner = raw[1:-1]
        if len(raw) < 2 or raw[-1] != '"' or '"' in inner or "\\" in inner or not inner.isprintable():
            return None
        return inner
    body = raw[1:] if raw[:1] in ("+", "-") and raw else raw
    mantissa, e, exponent = body.replace("E", "e").partition("e")
    whole, dot, fraction = mantissa.partition(".")
    if not _digits(whole) or (whole[0] == "0" and whole != "0"):
        return None
    if not dot and not e:
        return int(raw)
    if dot and not _digits(fraction):
        return None
    if e and not _digits(exponent[1:] if exponent[:1] in ("+", "-") else exponent):
        return None
    return float(raw)


def _coerce(cls: type, name: str, value: Any) -> Any:
    kind = _field_types(cls)[name]
    try:
        if kind == "bool":
            return _bool(value)
        if kind == "float":
            return float(value)
        if kind == "int":
            return int(value)
        return str(value)
    except (TypeError, ValueError):
        raise InvalidRequest(f"config {cls.__name__}.{name}: {value!r} is not a {kind}") from None


def _bool(value: Any) -> bool:
    """A TOML boolean, or the words an environment variable gives for one (true/false, 1/0, yes/no)."""
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in ("true", "1", "yes", "on"):
        return True
    if word in ("false", "0", "no", "off"):
        return False
    raise ValueError(word)


#: Each section's field types, by field name (a local cluster's file sets some 100 keys).
_TYPES: dict[type, dict[str, Any]] = {}


def _field_types(cls: type) -> dict[str, Any]:
    types = _TYPES.get(cls)
    if types is None:
        types = _TYPES[cls] = {f.name: f.type for f in section_fields(cls)}
    return types


def dump_toml(config: Config) -> str:
    """The config as TOML text (what ``hfai local up`` writes for its daemons)."""
    lines = []
    for name in _SECTIONS:
        lines.append(f"[{name}]")
        for f in dataclasses.fields(getattr(config, name)):
            value = getattr(getattr(config, name), f.name)
            if isinstance(value, bool):
                lines.append(f"{f.name} = {'true' if value else 'false'}")
            else:
                lines.append(f"{f.name} = {value!r}" if not isinstance(value, str) else f'{f.name} = "{value}"')
        lines.append("")
    return "\n".join(lines)
