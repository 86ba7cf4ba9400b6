"""The daemons themselves on a partition (issue 38 §7): three routed JetStream servers with R3
buckets and authentication, a controller, an agent and the storage service given all three URLs,
a job running. The server the agent is connected to is cut off from the other two
(tests/cutoff_cluster.py): the agent moves to another server within seconds, its heartbeats go on,
its job finishes in its first run (it is not requeued), and no controller raises a CRITICAL
store alarm."""

from __future__ import annotations

import pytest
from cutoff_cluster import PartitionableCluster
from spine_cluster import JOBS, Cluster
from waits import wait_for

from hfai.cli.local import LocalCluster
from hfai.protocol.types import ChainState, NodeState

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
STEPS = str(JOBS / "steps.py")
AGENT = "hfai-agent-node-0"


def test_an_agent_on_a_server_cut_off_moves_and_its_job_runs_on(tmp_path, monkeypatch):
    # The daemons read these (environment overrides of [nats]): checks every 0.5 s, 2 s to decide.
    for key, value in {"CHECK_S": "0.5", "TIMEOUT_S": "0.5", "SILENT_S": "1.5", "AFTER_S": "2.0"}.items():
        monkeypatch.setenv(f"HFAI_NATS_CUTOFF_{key}", value)
    issuer_of = LocalCluster(root=tmp_path / "hfai")  # the cluster's issuer, made before its servers
    with PartitionableCluster(tmp_path / "nats", auth=issuer_of.server_auth_config) as nats, \
            Cluster(tmp_path / "hfai", nodes=1, controllers=1, nats_url=nats.url, replicas=3,
                    heartbeat_timeout_s=30.0) as c:  # production's: a fence bound of 18 s
        job = c.submit(["python", STEPS, "24", "0.5"], name="across-the-cut", nodes=1)
        c.wait_state(job.id, ChainState.RUNNING, timeout=60)
        cut = wait_for(lambda: [nats.server_of(AGENT)] if nats.server_of(AGENT) is not None else None, 10.0,
                       "the agent's server")[0]
        nats.cut(cut)
        moved = wait_for(lambda: [nats.server_of(AGENT)] if nats.server_of(AGENT) not in (None, cut) else None, 20.0,
                         "the agent on another server")[0]

        def heartbeating():
            infos = c.run(lambda api: api.nodes())
            return any(i.record.name == "node-0" and i.state is NodeState.UP and i.age_s < 2 for i in infos)

        wait_for(heartbeating, 20.0, "fresh heartbeats from the agent after the cut")
        done = c.wait_state(job.id, ChainState.SUCCEEDED, timeout=90)
        assert done.run_id == 1, f"the job was requeued (run {done.run_id})"
        assert moved != cut
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "hfai" / "logs").glob("controller-*.log"))
    assert "CRITICAL" not in logs and "refuses writes" not in logs
