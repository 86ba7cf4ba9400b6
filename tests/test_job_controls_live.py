"""Dependencies, arrays, holds, requeue, updates, time limits and retries through the real CLI
against a local cluster (issue 13)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from spine_cluster import JOBS, Cluster

from hfai.protocol.types import ChainState, Priority

pytestmark = pytest.mark.slow

STEPS = str(JOBS / "steps.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("controls"), nodes=2) as c:
        yield c


def _id(stdout: str) -> str:
    return re.search(r"\((\w+)\)", stdout).group(1)


def _submit(cluster: Cluster, tmp_path: Path, *args: str) -> str:
    out = cluster.cli("submit", *args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return _id(out.stdout)


def test_after_waits_for_a_dependency_and_stops_when_it_can_never_be_met(cluster, tmp_path):
    first = _submit(cluster, tmp_path, "--name", "first", "python", STEPS, "15", "0.2")
    then = _submit(cluster, tmp_path, "--name", "then", "--after", first, "bash", "-c", "echo then ran")
    cluster.wait(lambda: "waiting for job" in cluster.job(then).reason, 20, "the dependent job to say why it waits")
    assert cluster.job(then).state is ChainState.QUEUED
    cluster.wait_state(first, ChainState.SUCCEEDED)
    cluster.wait_state(then, ChainState.SUCCEEDED)
    broken = _submit(cluster, tmp_path, "--name", "broken", "bash", "-c", "exit 3")
    never = _submit(cluster, tmp_path, "--name", "never", "--after", f"{broken}:ok", "bash", "-c", "true")
    anyway = _submit(cluster, tmp_path, "--name", "anyway", "--after", f"{broken}:any", "bash", "-c", "true")
    cluster.wait_state(broken, ChainState.FAILED)
    stopped = cluster.wait_state(never, ChainState.STOPPED)
    assert "dependency never satisfied" in stopped.reason
    cluster.wait_state(anyway, ChainState.SUCCEEDED)
    bad = cluster.cli("submit", "--after", "nosuchjob", "bash", "-c", "true", cwd=tmp_path)
    assert bad.returncode == 1 and "no job with that id or name" in bad.stderr and "Traceback" not in bad.stderr


def test_an_array_runs_each_index_and_at_most_its_limit_at_once(cluster, tmp_path):
    out = cluster.cli("submit", "--name", "sweep", "--array", "0-3%1", "bash", "-c",
                      "echo index=$HFAI_ARRAY_INDEX; sleep 0.5", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    ids = out.stdout.split("ids:")[1].split()
    assert len(ids) == 4 and "at most 1 at once" in out.stdout
    records = [cluster.wait_state(i, ChainState.SUCCEEDED) for i in ids]
    assert sorted(r.spec.name for r in records) == [f"sweep[{i}]" for i in range(4)]
    for r in records:
        assert f"index={r.spec.array_index}" in cluster.cli("logs", r.id).stdout
    # %1: no two members' runs overlapped.
    spans = sorted((r.started_ts, r.ended_ts) for r in records)
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:], strict=False))
    bad = cluster.cli("submit", "--array", "5-1", "bash", "-c", "true", cwd=tmp_path)
    assert bad.returncode == 2 and "--array" in bad.stderr and "Traceback" not in bad.stderr


def test_hold_release_update_and_requeue(cluster, tmp_path):
    blocker = _submit(cluster, tmp_path, "--name", "blocker", "-n", "2", "python", STEPS, "400", "0.1")
    cluster.wait_state(blocker, ChainState.RUNNING)
    waiting = _submit(cluster, tmp_path, "--name", "waiting", "bash", "-c", "echo done")
    held = cluster.cli("hold", waiting)
    assert held.returncode == 0 and "held" in held.stdout, held.stderr
    assert cluster.job(waiting).hold == "tester"
    updated = cluster.cli("update", waiting, "-p", "HIGH")
    assert updated.returncode == 0, updated.stderr
    assert cluster.job(waiting).spec.priority == Priority.HIGH.value
    # Held, it does not preempt the LOWER blocker although it is HIGH now.
    assert "held by tester" in cluster.job(waiting).reason
    assert cluster.job(blocker).state is ChainState.RUNNING
    wrong = cluster.cli("hold", blocker)
    assert wrong.returncode == 1 and "only a waiting job" in wrong.stderr
    others = cluster.cli("hold", waiting, user="mallory")
    assert others.returncode == 1 and "your own jobs" in others.stderr
    assert cluster.cli("release", waiting).returncode == 0
    cluster.wait_state(waiting, ChainState.SUCCEEDED)  # HIGH: it preempted the blocker
    # Requeue: the blocker resumes from its checkpoint and is interrupted once more on request.
    cluster.wait_state(blocker, ChainState.RUNNING)
    before = cluster.job(blocker).suspend_count
    assert cluster.cli("requeue", blocker).returncode == 0
    resumed = cluster.wait(lambda: (j := cluster.job(blocker)).suspend_count > before
                           and j.state is ChainState.RUNNING and j, 60, "the requeued job to run again")
    assert any("requeued by tester" in e.reason for e in resumed.history)
    assert cluster.cli("stop", blocker).returncode == 0
    cluster.wait_state(blocker, ChainState.STOPPED)


def test_a_time_limit_stops_a_job_and_a_retry_requeues_a_failed_run(cluster, tmp_path):
    limited = _submit(cluster, tmp_path, "--name", "limited", "-t", "3s", "python", STEPS, "1000", "0.1")
    stopped = cluster.wait_state(limited, ChainState.STOPPED, timeout=60)
    assert "time limit reached" in stopped.reason
    # Fails on its first run only (a marker file survives in the workdir).
    flaky = _submit(cluster, tmp_path, "--name", "flaky", "--retry", "2", "bash", "-c",
                    "if [ -e tried ]; then echo second; else touch tried; exit 7; fi")
    done = cluster.wait_state(flaky, ChainState.SUCCEEDED, timeout=60)
    assert done.retried == 1 and done.run_id == 2
    assert any("retry 1 of 2" in e.reason for e in done.history)


def test_a_list_can_leave_out_all_but_the_last_history_lines(cluster, tmp_path):
    from hfai.protocol.types import ListRequest

    done = _submit(cluster, tmp_path, "--name", "three-lines", "bash", "-c", "true")
    cluster.wait_state(done, ChainState.SUCCEEDED)  # queued, running, succeeded
    full = cluster.run(lambda api: api.list())
    assert any(len(j.history) > 2 for j in full)
    short = cluster.run(lambda api: api.list(request=ListRequest(history=2)))
    assert [j.id for j in short] == [j.id for j in full]
    for s, f in zip(short, full, strict=True):
        assert s.history == f.history[-2:] and s.state is f.state


def test_estimate_says_when_waiting_jobs_would_start(cluster, tmp_path):
    import json

    big = _submit(cluster, tmp_path, "--name", "big", "-n", "2", "-t", "1h", "python", STEPS, "4000", "0.1")
    cluster.wait_state(big, ChainState.RUNNING)
    nxt = _submit(cluster, tmp_path, "--name", "next", "-t", "10m", "bash", "-c", "true")
    out = cluster.cli("estimate", "--json")
    assert out.returncode == 0, out.stderr
    starts = {e["id"]: e["start"] for e in json.loads(out.stdout)}
    started = cluster.job(big).started_ts
    assert starts[nxt] == pytest.approx(started + 3600.0, abs=5.0)  # when big's hour is up
    table = cluster.cli("estimate")
    assert "next" in table.stdout and "in ~" in table.stdout
    # Behind a job without a time limit: a guess from the cluster's history, said to be one;
    # --assume forever gives none.
    forever = _submit(cluster, tmp_path, "--name", "forever", "-n", "2", "bash", "-c", "true")
    behind = _submit(cluster, tmp_path, "--name", "behind", "-n", "2", "-t", "10m", "bash", "-c", "true")
    guessed = {e["id"]: e for e in json.loads(cluster.cli("estimate", "--json").stdout)}
    assert guessed[behind]["start"] is not None and guessed[behind]["guess"] is True
    assert "guess: " in cluster.cli("estimate").stdout
    none = {e["id"]: e for e in json.loads(cluster.cli("estimate", "--json", "--assume", "forever").stdout)}
    assert none[behind]["start"] is None
    for job_id in (behind, forever, nxt, big):
        assert cluster.cli("stop", job_id).returncode == 0
    cluster.wait_state(big, ChainState.STOPPED)
