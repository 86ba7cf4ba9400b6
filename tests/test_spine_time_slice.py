"""Time slicing and the controller's log, through the real CLI against a local cluster (issue 13
defects 8 and 14): a job waiting for its time slice says when its turn comes, as users other than
the cluster's owner (HFAI_USER with their own credentials); the controller logs each state change
of a job once; the daemons' flags are documented."""

from __future__ import annotations

import re
import subprocess
import sys

import hfai_cli
import pytest
from spine_cluster import JOBS, Cluster

from hfai.protocol.types import ChainState

STEPS = str(JOBS / "steps.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("slice"), nodes=2, slice_s=600.0) as c:
        yield c


def _job_id(stdout: str) -> str:
    return stdout.split("(")[1].split(")")[0]


def _stop(cluster: Cluster, job_id: str, user: str) -> None:
    assert cluster.cli("stop", job_id, user=user).returncode == 0
    cluster.wait(lambda: cluster.job(job_id).state.final, 30, f"job {job_id} to stop")


@pytest.mark.slow
def test_a_job_waiting_for_its_time_slice_says_when_its_turn_comes(cluster, tmp_path):
    held = cluster.cli("submit", "-n", "2", "--name", "alices", "python", STEPS, "6000", "0.1", cwd=tmp_path,
                       user="alice")
    assert held.returncode == 0, held.stderr
    alices = _job_id(held.stdout)
    cluster.wait_state(alices, ChainState.RUNNING)
    waiting = cluster.cli("submit", "-n", "1", "--name", "bobs", "bash", "-c", "true", cwd=tmp_path, user="bob")
    assert waiting.returncode == 0, waiting.stderr
    bobs = _job_id(waiting.stdout)
    turn = re.compile(r"waiting for its time slice, next turn in ~(9|10) min")
    cluster.wait(lambda: turn.search(cluster.job(bobs).reason), 15, "bob's job to say when its turn comes")
    assert turn.search(cluster.cli("status", bobs, user="bob").stdout)
    assert "waiting for its time slice" in cluster.cli_env({"HFAI_USER": "bob", "COLUMNS": "200"}, "ps").stdout
    # Alice's own next job is no one's turn: slicing never takes her nodes for her.
    own = _job_id(cluster.cli("submit", "--name", "alices2", "bash", "-c", "true", cwd=tmp_path, user="alice").stdout)
    cluster.wait(lambda: cluster.job(own).reason not in ("", "queued"), 15, "alice's second job to be explained")
    assert "time slice" not in cluster.job(own).reason
    for job_id, user in ((bobs, "bob"), (own, "alice"), (alices, "alice")):
        _stop(cluster, job_id, user)


def test_the_slice_option_and_how_to_try_it_are_documented():
    out = hfai_cli.run(["local", "up", "--help"])
    text = " ".join(out.stdout.split())
    assert "among equal priorities" not in text
    assert "same priority and another user" in text and "HFAI_USER=bob" in text and "hfai admin user add bob" in text


@pytest.mark.slow
def test_the_controller_logs_each_state_change_once(cluster, tmp_path):
    """A two-node job preempted and resumed: its suspension was logged up to four times (the
    decision, each rank's ack, the first exit) and its requeue not at all."""
    low = _job_id(cluster.cli("submit", "-n", "2", "-p", "LOW", "--name", "low", "python", STEPS, "6000", "0.05",
                              cwd=tmp_path, user="alice").stdout)
    cluster.wait_state(low, ChainState.RUNNING)
    high = _job_id(cluster.cli("submit", "-p", "HIGH", "--name", "high", "bash", "-c", "sleep 1", cwd=tmp_path,
                               user="bob").stdout)
    cluster.wait_state(high, ChainState.SUCCEEDED)
    cluster.wait(lambda: cluster.job(low).run_id == 2 and cluster.job(low).state is ChainState.RUNNING, 30,
                 "the LOW job to resume")
    _stop(cluster, low, "alice")
    log = (cluster.local.root / "logs" / "controller-0.log").read_text()
    states = [line.split(" -> ")[1].split(":")[0] for line in log.splitlines() if f"job {low} (" in line]
    # (stopping is the API's change, not the leader's: the leader logs what it changes)
    assert states == ["running", "suspending", "suspended", "running", "stopped"], states


@pytest.mark.parametrize("command", [["-m", "hfai.cli.main", "agent"], ["-m", "hfai.cli.main", "controller"],
                                     ["-m", "hfai.agent"], ["-m", "hfai.controller"]])
def test_the_daemons_flags_are_documented(command):
    def run(*args: str) -> subprocess.CompletedProcess:
        if command[:2] == ["-m", "hfai.cli.main"]:  # the hfai command: in this process
            return hfai_cli.run([*command[2:], *args])
        return subprocess.run([sys.executable, *command, *args], capture_output=True, text=True, timeout=60)

    out = run("--help")
    text = " ".join(out.stdout.split())
    assert out.returncode == 0, out.stderr
    assert "--config" in text and "$HFAI_CONFIG" in text and "HFAI_<SECTION>_<FIELD>" in text
    assert "--log-level" in text and "DEBUG, INFO, WARNING, ERROR, CRITICAL" in text
    bad = run("--log-level", "chatty")
    assert bad.returncode == 2 and "chatty" in bad.stderr.lower() and "Traceback" not in bad.stderr
