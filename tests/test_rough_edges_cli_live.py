"""Everyday rough edges through the real CLI against one local cluster (issue 24): `--after NAME`
(item 5), `hfai status` showing the owner the job's -e values, and --json `env` (item 7), empty
workspace and dataset listings saying so (item 11)."""

from __future__ import annotations

import json

import pytest
from spine_cluster import Cluster

from hfai.protocol.types import ChainState

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("rough"), nodes=1) as c:
        yield c


def hfai(cluster, *args: str, user: str = "tester", ok: bool = True):
    """What `hfai ARGS` run as ``user`` in this process (cluster.cli) writes, stdout then stderr."""
    r = cluster.cli(*args, user=user)
    assert (r.returncode == 0) == ok, r.stdout + r.stderr
    return r.stdout + r.stderr


def test_after_takes_a_job_name(cluster):
    first = cluster.submit(["python", "-c", "pass"], "prepare-data")
    cluster.wait_state(first.id, ChainState.SUCCEEDED)
    out = hfai(cluster, "submit", "--after", "prepare-data:any", "--after", "prepare-data", "--name", "trainer",
               "python", "-c", "pass")
    job_id = out.split("(")[1].split(")")[0]
    assert cluster.job(job_id).spec.after == (f"{first.id}:any", first.id)
    refused = hfai(cluster, "submit", "--after", "no-such-job", "python", "-c", "pass", ok=False)
    assert "--after no-such-job: no job with that id or name" in refused


def test_status_shows_the_owner_its_env_values_and_hides_them_from_others(cluster):
    job = cluster.submit(["python", "-c", "pass"], "with-env", env={"WANDB_KEY": "k-123", "LR": "0.1"})
    mine = hfai(cluster, "status", job.id)
    assert "variables  LR=0.1" in mine and "WANDB_KEY=k-123" in mine
    assert json.loads(hfai(cluster, "status", job.id, "--json"))["env"] == {"LR": "0.1", "WANDB_KEY": "k-123"}
    theirs = hfai(cluster, "status", job.id, user="bob")
    assert "WANDB_KEY=<hidden>" in theirs and "k-123" not in theirs
    assert json.loads(hfai(cluster, "status", job.id, "--json", user="bob"))["env"] == {
        "LR": "<hidden>", "WANDB_KEY": "<hidden>"}


@pytest.mark.parametrize(("command", "says"), [("workspace", "no workspaces"), ("dataset", "no datasets")])
def test_empty_listings_say_none(cluster, command, says):
    out = hfai(cluster, command, "list", user="nobody-yet")
    assert out.startswith(says) and len(out.splitlines()) == 1


def test_empty_usage_says_none(cluster):
    out = hfai(cluster, "usage", "--user", "nobody-yet")
    assert out.startswith("no GPU use recorded in the last 7 day(s) by nobody-yet") and len(out.splitlines()) == 1


def test_a_job_sees_the_original_platform_s_names(cluster):
    """Issue 39 item 1: scripts read MASTER_IP with no fallback (`os.environ['MASTER_IP']`)."""
    code = "import os; print(*(os.environ[k] for k in ('MASTER_IP', 'MASTER_ADDR', 'MARSV2_TASK_TYPE', 'MARSV2_UID')))"
    job = cluster.submit(["python", "-c", code], "original-names")
    cluster.wait_state(job.id, ChainState.SUCCEEDED)
    [printed] = [line.split() for line in cluster.log(job.id).splitlines() if not line.startswith("===")]
    master_ip, master_addr, task_type, uid = printed
    assert master_ip == master_addr != "" and task_type == "training" and uid.isdigit()
