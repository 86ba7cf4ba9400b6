"""The CLI against a real local cluster: submit forms, ps, status, logs (-f, -r), nodes, stop."""

from __future__ import annotations

import pytest
from spine_cluster import JOBS, Cluster

from hfai.protocol.types import ChainState

# Starts real clusters (nats-server, controllers, agents): excluded by `pytest -m "not slow"`.
pytestmark = pytest.mark.slow

STEPS = str(JOBS / "steps.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("cli"), nodes=2) as c:
        yield c


def _job_id(stdout: str) -> str:
    return stdout.split("(")[1].split(")")[0]


def test_hfai_python_with_options_after_double_dash(cluster, tmp_path):
    r = cluster.cli("python", STEPS, "3", "0.05", "--", "-n", "2", "--name", "two-node", "-p", "HIGH",
                    "-e", "GREETING=hello", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = cluster.wait_state(_job_id(r.stdout), ChainState.SUCCEEDED)
    assert job.spec.nodes == 2 and job.spec.priority == 30 and job.spec.env == {"GREETING": "hello"}
    assert job.spec.workdir == str(tmp_path) and job.spec.entrypoint[:2] == ("python", STEPS)
    follow = cluster.cli("logs", "two-node", "-f", "-r", "1")
    assert follow.returncode == 0 and "rank 1 of 2 starts at step 0" in follow.stdout and "finished" in follow.stdout
    bad_rank = cluster.cli("logs", "two-node", "-r", "5")
    assert bad_rank.returncode != 0 and "ranks 0..1" in bad_rank.stderr


def test_ps_status_nodes_and_stop(cluster, tmp_path):
    r = cluster.cli("submit", "--name", "sleepy", "-p", "LOW", "python", STEPS, "200", "0.1", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job_id = _job_id(r.stdout)
    cluster.wait_state(job_id, ChainState.RUNNING)
    dup = cluster.cli("submit", "--name", "sleepy", "python", STEPS, "1", "0", cwd=tmp_path)
    assert dup.returncode != 0 and "already running" in dup.stderr

    ps = cluster.cli("ps")
    header, *rows = ps.stdout.splitlines()
    assert header.split()[:8] == ["ID", "NAME", "USER", "NODES", "PRIORITY", "STATE", "SUSPENDS", "AGE"]
    assert any(row.split()[:7] == [job_id, "sleepy", "tester", "1", "LOW", "running", "0"] for row in rows)

    status = cluster.cli("status", "sleepy")
    assert status.returncode == 0 and f"sleepy ({job_id})" in status.stdout and "history:" in status.stdout

    busy_node = cluster.job(job_id).nodes[0]

    def busy_row() -> list[str] | None:
        nodes = cluster.cli("nodes")
        row = {line.split()[0]: line.split() for line in nodes.stdout.splitlines()[1:]}[busy_node]
        return row if row[3] == "8/8" else None

    # A node's GPUs in use are its agent's figures: they come with its next heartbeat.
    row = cluster.wait(busy_row, 10, f"{busy_node}'s heartbeat to count the job's GPUs")
    assert row[2] == "up" and job_id in row[-1]

    stop = cluster.cli("stop", "sleepy")
    assert stop.returncode == 0
    stopped = cluster.wait_state(job_id, ChainState.STOPPED, timeout=30)
    assert "stopped by tester" in stopped.reason
    assert "sleepy" not in cluster.cli("ps").stdout and "stopped" in cluster.cli("ps", "-a").stdout


def test_job_runs_in_the_environment_named_by_hf_env_name(cluster, tmp_path):
    import os
    import sys

    env_bin = cluster.local.root / "envs" / "torch-env" / "bin"
    env_bin.mkdir(parents=True, exist_ok=True)
    if not (env_bin / "python").exists():
        os.symlink(sys.executable, env_bin / "python")
    script = tmp_path / "which.py"
    script.write_text("import os, sys\nprint('env', os.environ['HF_ENV_NAME'], os.environ['VIRTUAL_ENV'], "
                      "os.environ['PATH'].split(os.pathsep)[0])\n")

    def offered():
        return all("torch-env" in n.record.envs for n in cluster.run(lambda api: api.nodes()))

    cluster.wait(offered, 10, "agents to advertise the environment")
    r = cluster.cli("python", str(script), "--", "-i", "torch-env", "--name", "in-env", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    cluster.wait_state(_job_id(r.stdout), ChainState.SUCCEEDED)
    assert f"env torch-env {env_bin.parent} {env_bin}" in cluster.cli("logs", "in-env").stdout
