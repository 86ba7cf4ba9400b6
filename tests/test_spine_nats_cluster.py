"""Integration: the production shape of the shared state — a 3-server NATS JetStream cluster with
replicated (R3) buckets and streams, TLS on client and route ports, JWT authentication, two
controller replicas, agents given all three server URLs. Jobs run, and keep running and being
scheduled after one NATS server is killed; a revocation pushed to one server reaches the others."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import socket
import subprocess
from pathlib import Path

import nats
import pytest
from spine_cluster import JOBS, Cluster
from waits import until, wait_for

from hfai.cli.local import LocalCluster
from hfai.cli.local.nats_server import nats_server_binary
from hfai.core import nats as _nats
from hfai.core.config import Config, NatsConfig
from hfai.protocol import names
from hfai.protocol.errors import Unavailable
from hfai.protocol.types import ChainState, NodeState

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]
STEPS = str(JOBS / "steps.py")


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def make_tls(root: Path) -> dict[str, Path]:
    """A throwaway CA and one server certificate for 127.0.0.1 (used by all three servers, as
    server and as route client), made with the openssl command."""
    root.mkdir(parents=True, exist_ok=True)
    ca, ca_key, cert, key = root / "ca.pem", root / "ca-key.pem", root / "server.pem", root / "server-key.pem"
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa: E731
    run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2", "-subj", "/CN=hfai-test-ca")
    run("req", *ec, "-keyout", str(key), "-out", str(root / "server.csr"), "-subj", "/CN=127.0.0.1")
    (root / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    run("x509", "-req", "-in", str(root / "server.csr"), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(root / "ext.cnf"))
    return {"ca": ca, "cert": cert, "key": key}


class NatsCluster:
    """Three JetStream servers on loopback, routed to each other as in systemd/nats.conf.example,
    optionally with TLS (``tls`` from :func:`make_tls`) and authentication (``auth``: the config
    block of an hfai issuer, given the server's resolver directory)."""

    def __init__(self, root: Path, size: int = 3, tls: dict[str, Path] | None = None, auth=None):
        ports = _free_ports(2 * size)
        self.client_ports, self.route_ports = ports[:size], ports[size:]
        self.root, self.size = root, size
        self.tls, self.auth = tls, auth
        self.procs: list[subprocess.Popen] = []

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{p}" for p in self.client_ports)

    def log(self, i: int) -> Path:
        return self.root / f"nats-{i}.log"

    def start(self, i: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        routes = ", ".join(f"nats://127.0.0.1:{p}" for p in self.route_ports)
        conf = self.root / f"nats-{i}.conf"
        tls = ""
        if self.tls:
            tls = (f'  tls {{ cert_file: "{self.tls["cert"]}", key_file: "{self.tls["key"]}", '
                   f'ca_file: "{self.tls["ca"]}" }}\n')
        conf.write_text(
            f"server_name: nats-{i}\nlisten: 127.0.0.1:{self.client_ports[i]}\n"
            + tls.strip() + "\n"
            f"jetstream {{\n  store_dir: {self.root / f'js-{i}'}\n}}\n"
            f"cluster {{\n  name: hfai\n  listen: 127.0.0.1:{self.route_ports[i]}\n"
            f"  routes: [{routes}]\n{tls}}}\n"
            + (self.auth(self.root / f"accounts-{i}") if self.auth else "")
        )
        with open(self.log(i), "ab") as logf:
            self.procs.append(subprocess.Popen([nats_server_binary(), "-c", str(conf)], stdout=logf,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def wait_formed(self, timeout_s: float = 60.0) -> None:
        """Every server up, and the JetStream meta group has a leader (replicated assets cannot be
        created before)."""
        def formed() -> bool:
            logs = [self.log(i).read_text(errors="replace") for i in range(self.size)]
            return all("Server is ready" in t for t in logs) and any(
                re.search(r"JetStream cluster new metadata leader|Self is new JetStream cluster metadata leader", t)
                for t in logs)

        wait_for(formed, timeout_s, f"the NATS cluster to form; see {self.root}")

    def __enter__(self) -> NatsCluster:
        try:
            for i in range(self.size):
                self.start(i)
            self.wait_formed()
        except BaseException:
            self.__exit__()
            raise
        return self

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(10)

    def __exit__(self, *exc) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def test_jobs_survive_the_loss_of_one_nats_server(tmp_path):
    tls = make_tls(tmp_path / "tls")
    issuer_of = LocalCluster(root=tmp_path / "hfai")  # the cluster's issuer, made before its servers
    with NatsCluster(tmp_path / "nats", tls=tls, auth=issuer_of.server_auth_config) as nats, \
            Cluster(tmp_path / "hfai", nodes=2, controllers=2, nats_url=nats.url, replicas=3,
                    tls_ca=str(tls["ca"])) as c:
        assert c.config.nats.replicas == 3 and c.config.nats.url.count(",") == 2
        assert c.config.nats.tls_ca
        first = c.submit(["python", STEPS, "6", "0.5"], name="before", nodes=2)
        c.wait_state(first.id, ChainState.RUNNING, timeout=60)

        nats.kill(0)  # a server the daemons may be connected to, maybe a stream leader

        # The running job finishes and is recorded; a new job is scheduled and run.
        c.wait_state(first.id, ChainState.SUCCEEDED, timeout=90)
        second = c.submit(["python", STEPS, "2", "0.2"], name="after", nodes=1)
        done = c.wait_state(second.id, ChainState.SUCCEEDED, timeout=90)
        assert "finished" in c.log(done.id)

        def both_nodes_heartbeating():
            infos = c.run(lambda api: api.nodes())
            return {i.record.name for i in infos if i.state is NodeState.UP and i.age_s < 3} == {"node-0", "node-1"}

        c.wait(both_nodes_heartbeating, 30, "fresh heartbeats from both agents after the server loss")

        # A user revoked through one server is refused by every server of the cluster.
        assert c.cli("ps", user="erin").returncode == 0
        removed = c.cli_env({"HFAI_ISSUER": str(tmp_path / "hfai" / "auth")}, "admin", "user", "remove", "erin")
        assert removed.returncode == 0, removed.stderr
        for port in nats.client_ports[1:]:
            one = {"HFAI_USER": "erin", "HFAI_NATS_URL": f"nats://127.0.0.1:{port}"}
            c.wait(lambda one=one: c.cli_env(one, "ps").returncode != 0, 20, f"server on {port} to refuse erin")


def test_setup_waits_for_the_nats_cluster_to_form(tmp_path, caplog):
    """A daemon started with the first of its NATS servers waits (no crash) until JetStream can
    place replicated buckets, then creates them."""
    cluster = NatsCluster(tmp_path / "nats")
    config = Config(nats=NatsConfig(url=cluster.url, replicas=3, setup_retry_s=0.2))
    try:
        cluster.start(0)

        def retries() -> int:
            return sum("JetStream not ready" in r.getMessage() for r in caplog.records)

        async def go():
            nc = await nats.connect(cluster.url.split(",")[:1])
            try:
                setup = asyncio.ensure_future(_nats.ensure_shared_state(nc.jetstream(), config))
                await until(lambda: retries() >= 3, 30, "setup to retry three times")
                assert not setup.done(), "set up R3 buckets with one server of three?"
                for i in range(1, cluster.size):
                    cluster.start(i)
                buckets = await asyncio.wait_for(setup, 90)
                await buckets.jobs.put("probe", b"1")
                assert (await buckets.jobs.get("probe")).value == b"1"
                assert (await nc.jetstream().stream_info(f"KV_{names.BUCKET_JOBS}")).config.num_replicas == 3
            finally:
                await nc.close()

        with caplog.at_level(logging.WARNING, logger=_nats.__name__):
            asyncio.run(go())
    finally:
        cluster.__exit__()


def test_setup_reports_replicas_a_single_server_cannot_have(nats_url):
    async def go(url):
        config = Config(nats=NatsConfig(url=url, replicas=3, setup_retry_s=0.2))
        nc = await nats.connect(url)
        try:
            with pytest.raises(Unavailable, match="non-clustered"):
                await asyncio.wait_for(_nats.ensure_shared_state(nc.jetstream(), config), 30)
        finally:
            await nc.close()

    asyncio.run(go(nats_url))
