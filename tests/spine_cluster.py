"""Test harness: a real local cluster (nats-server, controllers, agents as processes) per test,
with every window short so a whole interrupt cycle takes seconds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import hfai_cli
from waits import wait_for

from hfai.api.client import ApiClient
from hfai.cli.local import LocalCluster
from hfai.cli.local.nats_server import start_nats
from hfai.core import nats as _nats
from hfai.core.config import AgentConfig, ControllerConfig
from hfai.protocol import decode, names
from hfai.protocol.types import ChainState, JobRecord, JobSpec, LeaderLease

TEST_CONTROLLER = ControllerConfig(
    lease_ttl_s=2.0, lease_poll_s=0.2, schedule_interval_s=0.2, slice_s=3600.0,
    ack_window_s=10.0, kill_window_s=3.0, heartbeat_timeout_s=8.0, event_ack_wait_s=2.0,
    # The tests submit HIGH jobs as plain users and retry failed runs: every level open without a
    # quota and a short retry backoff (the defaults are tested in test_rough_edges_policy.py).
    quota_needed_above=50, retry_backoff_s=0.5,
)
# Tests submit as made-up users (tester, alice, ...) who have no Unix account here: their jobs run
# as the test's own user. tests/test_agent_isolation*.py covers jobs run as their submitters.
TEST_AGENT = AgentConfig(heartbeat_interval_s=0.5, reconcile_interval_s=0.2, gpu_source="sim", run_as="agent")
# Users the harness gives operator credentials (everyone else gets a plain user's).
OPERATORS = {"root"}

REPO = Path(__file__).resolve().parent.parent
JOBS = Path(__file__).resolve().parent / "jobs"


@contextlib.contextmanager
def nats_server(root: Path):
    """A lone JetStream nats-server for a test; yields its URL, stops it afterwards."""
    proc, url = start_nats(root / "js", root / "nats.log")
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


class Cluster:
    """A LocalCluster plus synchronous helpers for tests."""

    def __init__(self, root: Path, nodes: int = 2, controllers: int = 1, nats_url: str | None = None,
                 replicas: int = 1, tls_ca: str = "", agent: AgentConfig | None = None, **controller_overrides):
        cc = dataclasses.replace(TEST_CONTROLLER, **controller_overrides)
        self.local = LocalCluster(root=root, nodes=nodes, controllers=controllers, controller=cc,
                                  agent=agent or TEST_AGENT,
                                  replicas=replicas, tls_ca=tls_ca)
        self.nodes = nodes
        self.nats_url = nats_url  # join these NATS servers instead of starting one

    def __enter__(self) -> Cluster:
        try:
            self.local.up(self.nats_url)
            self.local.wait_ready()
        except BaseException:
            self.local.down()  # __exit__ does not run when __enter__ fails: never leak daemons
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.local.down()

    @property
    def config(self):
        return self.local.config()

    def creds(self, user: str) -> Path:
        """``user``'s credentials file, issued on first use (operators: see OPERATORS)."""
        return self.local.user_creds(user, operator=user in OPERATORS)

    def run(self, fn, user: str = "tester"):
        self.creds(user)

        async def go():
            async with ApiClient(self.config, user=user) as api:
                return await fn(api)

        return asyncio.run(go())

    def submit(self, entrypoint: list[str], name: str, nodes: int = 1, priority: int = 10, user: str = "tester",
               workdir: Path | None = None, **spec) -> JobRecord:
        s = JobSpec(name=name, entrypoint=tuple(entrypoint), workdir=str(workdir or self.local.root), nodes=nodes,
                    priority=priority, **spec)
        return self.run(lambda api: api.submit(s), user=user)

    def job(self, ref: str) -> JobRecord:
        return self.run(lambda api: api.status(ref))

    def wait(self, cond, timeout: float, what: str, poll: float = 0.1):
        return wait_for(cond, timeout, what, poll)

    def wait_state(self, ref: str, state: ChainState, timeout: float = 60.0) -> JobRecord:
        def check():
            j = self.job(ref)
            assert not (j.state.final and j.state is not state), f"job {ref} ended {j.state}: {j.reason}"
            return j if j.state is state else None

        return self.wait(check, timeout, f"job {ref} to be {state.value}")

    def log(self, job_id: str, rank: int = 0, node: str | None = None) -> str:
        node = node or self.job(job_id).last_nodes[rank]
        path = self.local.root / "agents" / node / "logs" / job_id / f"rank{rank}.log"
        return path.read_text() if path.exists() else ""

    def leader(self) -> str | None:
        async def go():
            import nats
            import nats.js.errors

            nc = await _nats.connect(self.config, "test-harness", reconnect=False, creds=str(self.service_creds()))
            try:
                kv = await nc.jetstream().key_value(names.BUCKET_LEADER)
                try:
                    return decode((await kv.get(names.LEADER_KEY)).value, LeaderLease).holder
                except nats.js.errors.KeyNotFoundError:
                    return None
            finally:
                await nc.close()

        return asyncio.run(go())

    def service_creds(self) -> Path:
        """The controller's credentials (tests use them to reach what users may not)."""
        from hfai.auth.roles import Role

        return self.local.service_creds("controller-0", Role.CONTROLLER)

    def cli(self, *args: str, cwd: Path | None = None, user: str = "tester") -> subprocess.CompletedProcess:
        """``hfai ARGS`` as ``user`` (credentials issued on first use), run in this process
        (tests/hfai_cli.py); it answers as a finished process does."""
        self.creds(user)
        return self.cli_env({"HFAI_USER": user}, *args, cwd=cwd)

    def cli_env(self, extra: dict[str, str | None], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        """The CLI in this process with these environment variables (issues no credentials)."""
        return hfai_cli.run(args, env=self._cli_environ(extra), cwd=cwd or REPO)

    def cli_process(self, *args: str, cwd: Path | None = None, user: str = "tester") -> subprocess.CompletedProcess:
        """``hfai ARGS`` as ``user`` in a real process of its own, for what only a process shows
        (its start and exit, how long it takes from the outside)."""
        return subprocess.run(**self._process(args, cwd, user), capture_output=True, text=True, timeout=60)

    def cli_popen(self, *args: str, cwd: Path | None = None, user: str = "tester", **popen) -> subprocess.Popen:
        """``hfai ARGS`` as ``user`` started in a process of its own and left running (to be
        stopped or killed midway); ``popen``: subprocess.Popen's other arguments."""
        return subprocess.Popen(**self._process(args, cwd, user), **popen)

    def _process(self, args: tuple[str, ...], cwd: Path | None, user: str) -> dict:
        self.creds(user)
        env = {**os.environ, **self._cli_environ({"HFAI_USER": user})}
        return {"args": [sys.executable, "-m", "hfai.cli.main", *args], "cwd": cwd or REPO,
                "env": {k: v for k, v in env.items() if v is not None}}

    def _cli_environ(self, extra: dict[str, str | None]) -> dict[str, str | None]:
        """The CLI's environment changes: this cluster's config, none of the test's own NATS settings."""
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith(("HFAI_NATS_", "HFAI_ISSUER"))}
        env.update(HFAI_CONFIG=str(self.local.config_path), **extra)
        return env


def cli_env(cluster: Cluster, user: str = "tester") -> dict[str, str]:
    """The environment of an ``hfai`` process run as ``user`` against ``cluster`` (none of this
    process's NATS or issuer overrides)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HFAI_NATS_", "HFAI_ISSUER"))}
    return {**env, "HFAI_CONFIG": str(cluster.local.config_path), "HFAI_USER": user}
