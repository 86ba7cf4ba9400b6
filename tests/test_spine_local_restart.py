"""`hfai local down` then `hfai local up` in the same HFAI_HOME (issue 13 defect 1), through the
real CLI: running jobs are interrupted and requeued (never failed) and resume, queued jobs stay
queued, nodes the new cluster lacks are forgotten and get no work, and `hfai local reset` /
`up --fresh` wipe the state, credentials included."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from spine_cluster import JOBS, REPO
from waits import wait_for

from hfai.api.client import ApiClient
from hfai.api.config import current_user
from hfai.cli.local import LocalCluster
from hfai.cli.local.cluster import ghost_nodes
from hfai.controller.nodes import unknown_nodes
from hfai.protocol.types import ChainState, JobRecord, JobSpec

STEPS = str(JOBS / "steps.py")


def hfai(home: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it: no HFAI_CONFIG, the local cluster found under HFAI_HOME."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_")}
    env["HFAI_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "hfai.cli.main", *args], cwd=cwd or REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def ok(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def job_id(stdout: str) -> str:
    return stdout.split("(")[1].split(")")[0]


def job(home: Path, ref: str) -> JobRecord:
    local = LocalCluster.load(home / "local")
    assert local is not None

    async def go():
        async with ApiClient(local.config(), user=current_user()) as api:
            return await api.status(ref)

    return asyncio.run(go())


def wait_state(home: Path, ref: str, state: ChainState, timeout: float = 60.0, run: int = 0) -> JobRecord:
    """The job's record once it is in ``state`` (in run ``run`` or later, if given: a job that was
    running at `local down` still reads running in its old run until the new leader applies its
    interruption)."""
    seen: list[JobRecord] = []

    def check():
        seen[:] = [job(home, ref)]
        return seen[0] if seen[0].state is state and seen[0].run_id >= run else None

    try:
        return wait_for(check, timeout, f"job {ref} to be {state.value}")
    except AssertionError as e:
        raise AssertionError(f"{e}; it is {seen[0].state.value}: {seen[0].reason}") from None


@pytest.mark.slow
def test_down_interrupts_up_resumes_and_forgets_the_nodes_it_lacks(home, tmp_path):
    ok(hfai(home, "local", "up", "--nodes", "3"))
    big = job_id(ok(hfai(home, "submit", "-n", "3", "--name", "big", "python", STEPS, "6000", "0.1", cwd=tmp_path)))
    wait_for(lambda: "starts at step 0" in (home / "local/agents/node-0/logs" / big / "rank0.log").read_text()
             if (home / "local/agents/node-0/logs" / big / "rank0.log").exists() else False, 60, "big to start")
    # It lasts a few seconds: `local up` counts the jobs it resumed after the controller is back,
    # and with forked launchers a job of nothing but `echo` may already be over by then.
    later = job_id(ok(hfai(home, "submit", "--name", "later", "bash", "-c", "sleep 3; echo later ran",
                           cwd=tmp_path)))
    wait_for(lambda: job(home, later).reason not in ("", "queued"), 20, "the second job to wait")

    down = ok(hfai(home, "local", "down"))
    assert "interrupting 3 running job rank(s)" in down and "resume at the next `hfai local up`" in down
    # The job checkpointed on its suspend flag: every rank saved its step.
    assert all((tmp_path / f"steps_{big}_{r}.txt").exists() for r in range(3))

    up = ok(hfai(home, "local", "up", "--nodes", "2"))
    assert "forgot node(s) node-2" in up and "2 job(s) in the queue" in up and "--fresh" in up
    nodes = ok(hfai(home, "nodes"))
    assert "node-2" not in nodes and "node-0" in nodes and "node-1" in nodes
    after = wait_state(home, later, ChainState.SUCCEEDED)  # queued, it runs now: never on the forgotten node
    assert after.last_nodes and "node-2" not in after.last_nodes
    interrupted = wait_state(home, big, ChainState.SUSPENDED)
    assert interrupted.suspend_count == 1 and "failed" not in [h.state.value for h in interrupted.history]
    assert "stopped by the platform" in ok(hfai(home, "status", big))
    assert "needs 3 nodes" in interrupted.reason  # it waits for a cluster that has them

    # A job that ignores its suspend flag: --now stops it at once, and it is requeued all the same.
    stubborn = job_id(ok(hfai(home, "submit", "--name", "stubborn", "bash", "-c", "sleep 600", cwd=tmp_path)))
    wait_state(home, stubborn, ChainState.RUNNING)
    began = time.monotonic()
    ok(hfai(home, "local", "down", "--now"))
    assert time.monotonic() - began < 20

    up = ok(hfai(home, "local", "up", "--nodes", "3"))
    assert "forgot" not in up
    # The agents reported its end as an interruption before they stopped; the new leader applies
    # that report from the events stream a moment after `up` returns (a CI run read it first).
    def interrupted_once():
        record = job(home, stubborn)
        return record if record.suspend_count == 1 else None

    stopped = wait_for(interrupted_once, 30, "the interruption to be applied")
    assert stopped.state in (ChainState.SUSPENDED, ChainState.RUNNING) and stopped.suspend_count == 1
    assert "failed" not in [h.state.value for h in stopped.history]
    # If the first rounds saw only some of the three agents, it may have started in the meantime
    # (an own job backfills while big cannot fit): out of big's way.
    ok(hfai(home, "stop", stubborn))
    resumed = wait_state(home, big, ChainState.RUNNING)
    assert resumed.run_id == 2
    log = (home / "local/agents" / resumed.nodes[0] / "logs" / big / "rank0.log")
    wait_for(lambda: "run 2 rank 0 of 3 starts at step" in log.read_text(), 30, "big to resume")
    assert "starts at step 0" not in log.read_text().split("run 2 rank 0")[1]  # from its checkpoint
    ok(hfai(home, "local", "down", "--now"))


@pytest.mark.slow
def test_reset_and_fresh_wipe_jobs_nodes_and_credentials(home, tmp_path):
    ok(hfai(home, "local", "up", "--nodes", "2"))
    ok(hfai(home, "submit", "--name", "waits", "-n", "2", "bash", "-c", "sleep 600", cwd=tmp_path))
    ok(hfai(home, "admin", "user", "add", "bob"))
    creds = home / "local" / "creds" / f"{current_user()}.creds"
    before = creds.read_text()
    refused = hfai(home, "local", "reset")
    assert refused.returncode != 0 and "hfai local down" in refused.stderr and "Traceback" not in refused.stderr
    assert hfai(home, "local", "up", "--fresh").returncode != 0  # running: nothing wiped
    ok(hfai(home, "local", "down", "--now"))

    ok(hfai(home, "local", "reset"))
    assert not (home / "local" / "creds").exists() and not (home / "local" / "auth").exists()
    ok(hfai(home, "local", "up", "--nodes", "1"))
    assert "resumed" not in ok(hfai(home, "ps", "-a")) and "waits" not in ok(hfai(home, "ps", "-a"))
    assert creds.read_text() != before and not (home / "local" / "creds" / "bob.creds").exists()
    assert [line.split()[0] for line in ok(hfai(home, "nodes")).splitlines()[1:]] == ["node-0"]
    ok(hfai(home, "submit", "--name", "again", "bash", "-c", "sleep 600", cwd=tmp_path))
    ok(hfai(home, "local", "down", "--now"))

    up = ok(hfai(home, "local", "up", "--nodes", "1", "--fresh"))
    assert "resumed" not in up and "again" not in ok(hfai(home, "ps", "-a"))
    ok(hfai(home, "local", "down"))


# ------------------------------------------------------------------------- pure decisions

def test_ghost_and_unknown_nodes():
    assert ghost_nodes(["node-0", "node-1", "node-2"], ["node-0", "node-1"]) == ["node-2"]
    spec = JobSpec(name="j", entrypoint=("true",), workdir="/", nodes=2)
    held = JobRecord(id="j", spec=spec, state=ChainState.SUSPENDING, submit_ts=0.0, nodes=("node-0", "node-2"))
    done = JobRecord(id="k", spec=spec, state=ChainState.FAILED, submit_ts=0.0, nodes=("node-3",))
    # Held nodes nobody has a record of are down, after the heartbeat window a takeover gives.
    assert unknown_nodes([held, done], {"node-0", "node-1"}, 11.0, 10.0) == {"node-2"}
    assert unknown_nodes([held, done], {"node-0", "node-1"}, 9.0, 10.0) == set()


@pytest.mark.slow
def test_local_status_lists_the_pages_and_every_daemons_metrics(home):
    """`hfai local up` turns every daemon's /metrics on, and `hfai local status` says where they are."""
    import urllib.request

    ok(hfai(home, "local", "up", "--nodes", "1"))

    def listed():
        lines = ok(hfai(home, "local", "status")).splitlines()
        urls = {line.split(":", 1)[0].strip(): line.split()[-1] for line in lines if "http://" in line}
        return urls if {"controller-0 metrics", "agent-node-0 metrics", "web pages"} <= set(urls) else None

    urls = wait_for(listed, 30, "local status to list the pages and both daemons' metrics")
    for what in ("controller-0 metrics", "agent-node-0 metrics"):
        with urllib.request.urlopen(urls[what], timeout=10) as r:
            body = r.read().decode()
        assert r.status == 200 and "# TYPE hfai_" in body, (what, body[:300])
    ok(hfai(home, "local", "down", "--now"))
