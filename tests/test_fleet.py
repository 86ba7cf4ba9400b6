"""Many agents in one process (hfai.agent.fleet), as the scale benchmark hosts them: each is a real
agent with its own node name, state directory and credentials, against a real cluster with auth on."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from spine_cluster import Cluster

from hfai.agent import fleet
from hfai.auth.roles import Role
from hfai.core.config import AgentConfig, Config, NatsConfig
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import ChainState, NodeState

NODES = 5


def test_node_names_run_from_first():
    assert fleet.node_names(998, 3) == ["node-998", "node-999", "node-1000"]
    assert fleet.node_names(0, 0) == []
    with pytest.raises(ValueError):
        fleet.node_names(-1, 2)
    with pytest.raises(InvalidRequest):
        fleet.node_names(0, 1, prefix="bad/")


def test_each_agent_gets_its_own_node_state_and_credentials():
    base = Config(nats=NatsConfig(url="nats://x:1", creds="/shared.creds"),
                  agent=AgentConfig(node="ignored", gpu_source="nvml", heartbeat_interval_s=7.0))
    c = fleet.agent_config(base, "node-3", "/var/fleet", "/etc/creds")
    assert (c.agent.node, c.agent.state_dir, c.nats.creds) == ("node-3", "/var/fleet/node-3", "/etc/creds/node-3.creds")
    assert c.agent.gpu_source == "sim" and c.agent.address == "127.0.0.1"
    assert c.agent.heartbeat_interval_s == 7.0 and c.nats.url == "nats://x:1"  # the rest is shared
    assert fleet.agent_config(base, "node-3", "/var/fleet", None).nats.creds == ""


@pytest.mark.slow
def test_a_fleet_without_credentials_stops_with_one_line(tmp_path):
    env = dict(os.environ, HFAI_CONFIG="", HFAI_NATS_URL="nats://127.0.0.1:1")
    env.pop("HFAI_NATS_CREDS", None)
    r = subprocess.run(fleet.fleet_argv(2, 0, tmp_path / "state", tmp_path / "no-creds"), env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "no NATS credentials at" in r.stderr and "node-0.creds" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_fleet_in_one_process_joins_the_cluster_and_runs_a_two_node_job(tmp_path):
    with Cluster(tmp_path / "cluster", nodes=0) as c:
        local = c.local
        nodes = fleet.node_names(0, NODES)
        for n in nodes:
            local.service_creds(n, Role.AGENT)
        proc = fleet.spawn(local.config_path, NODES, 0, local.root / "agents", local.root / "auth" / "creds",
                           local.root / "logs" / "fleet.log")
        try:
            def all_up():
                infos = c.run(lambda api: api.nodes())
                return {i.record.name for i in infos if i.state is NodeState.UP} == set(nodes)

            c.wait(all_up, 60, f"the fleet's {NODES} agents to heartbeat")
            job = c.submit(["sh", "-c", 'echo "rank $RANK of $WORLD_SIZE on $HFAI_NODE"'], name="pair", nodes=2)
            done = c.wait_state(job.id, ChainState.SUCCEEDED, timeout=60)
            assert len(set(done.last_nodes)) == 2 and set(done.last_nodes) <= set(nodes)
            for rank, node in enumerate(done.last_nodes):
                assert f"\nrank {rank} of 2 on {node}\n" in c.log(job.id, rank)
            # Each agent keeps its own state directory.
            assert all((local.root / "agents" / n / "runs").is_dir() for n in nodes)

            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        log = (local.root / "logs" / "fleet.log").read_text()
        assert f"fleet of {NODES} agents up" in log, log[-2000:]
        # Each line says which agent wrote it, also from the tasks an agent started.
        assert all(f"INFO {n} hfai.agent.service: agent {n} up" in log for n in nodes), log[-2000:]
        assert all(f"INFO {n} hfai.agent.reconcile: started {job.id}." in log for n in done.last_nodes), log[-2000:]
