"""Rough edges of the CLI found in use (issue 13), through the real CLI against a local cluster."""

from __future__ import annotations

import re

import pytest
from spine_cluster import JOBS, Cluster

from hfai.protocol.types import ChainState

# Starts processes (a cluster or torch workers): seconds each; `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

STEPS = str(JOBS / "steps.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("usability"), nodes=2) as c:
        yield c


def _job_id(stdout: str) -> str:
    return stdout.split("(")[1].split(")")[0]


@pytest.mark.parametrize("args, name, printed", [
    (["submit", "-n", "1", "bash", "-c", "echo hi from bash"], "bash", "hi from bash"),
    (["submit", "-n", "1", "python", "-c", "print('hi from python')"], "python", "hi from python"),
    (["python", "-c", "print('hi via hfai python')", "--", "-n", "1"], "python", "hi via hfai python"),
])
def test_inline_programs_need_no_script_file(cluster, tmp_path, args, name, printed):
    r = cluster.cli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = cluster.wait_state(_job_id(r.stdout), ChainState.SUCCEEDED)
    assert job.spec.name == name and printed in cluster.log(job.id)


def test_a_missing_script_after_interpreter_options_is_still_refused(cluster, tmp_path):
    r = cluster.cli("submit", "python", "-u", "no_such_train.py", cwd=tmp_path)
    assert r.returncode != 0 and "'no_such_train.py' does not exist" in r.stderr and "Traceback" not in r.stderr


def test_quota_set_minus_one_removes_the_quota(cluster):
    assert cluster.cli("quota", "set", "alice", "HIGH", "4", user="root").returncode == 0
    listed = cluster.cli("quota", "ls").stdout
    assert any(line.split() == ["alice", "HIGH", "*", "4"] for line in listed.splitlines()), listed
    removed = cluster.cli("quota", "set", "alice", "HIGH", "-1", user="root")
    assert removed.returncode == 0, removed.stderr
    assert "alice" not in cluster.cli("quota", "ls").stdout
    below = cluster.cli("quota", "set", "alice", "HIGH", "-2", user="root")
    assert below.returncode != 0 and "Traceback" not in below.stderr


@pytest.mark.parametrize("given", ["7", "-1", "51", "urgent"])
def test_priorities_are_levels_by_name_or_number_only(cluster, tmp_path, given):
    r = cluster.cli("submit", "-p", given, "bash", "-c", "true", cwd=tmp_path)
    assert r.returncode != 0 and f"unknown priority {given!r}" in r.stderr and "LOW 0" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and sum(line.startswith("Error") for line in r.stderr.splitlines()) == 1


def test_priority_numbers_help_and_auto_agree(cluster, tmp_path):
    from hfai.protocol.types import Priority

    r = cluster.cli("submit", "-p", "30", "--name", "by-number", "bash", "-c", "true", cwd=tmp_path)
    assert r.returncode == 0 and "priority HIGH" in r.stdout, r.stderr
    assert cluster.wait_state(_job_id(r.stdout), ChainState.SUCCEEDED).spec.priority == 30
    auto = cluster.cli("submit", "-p", "auto", "--name", "by-auto", "bash", "-c", "true", cwd=tmp_path)
    assert auto.returncode == 0 and "priority NORMAL" in auto.stdout, auto.stderr  # no quotas: NORMAL
    help_text = " ".join(cluster.cli("submit", "--help").stdout.split())
    assert Priority.choices() in help_text and "0-50" not in help_text
    assert Priority.parse("Above-Normal") == 20 and Priority.parse(" 50 ") == 50


def test_a_name_means_the_active_job_and_two_active_ones_are_ambiguous(cluster, tmp_path):
    first = _job_id(cluster.cli("submit", "--name", "dup", "python", STEPS, "600", "0.1", cwd=tmp_path).stdout)
    cluster.wait_state(first, ChainState.RUNNING)
    done = _job_id(cluster.cli("submit", "-f", "--name", "dup", "bash", "-c", "true", cwd=tmp_path).stdout)
    cluster.wait_state(done, ChainState.SUCCEEDED)
    assert f"({first})" in cluster.cli("status", "dup").stdout  # the running one, not the newest
    stop = cluster.cli("stop", "dup")
    assert stop.returncode == 0 and f"({first})" in stop.stdout, stop.stdout + stop.stderr
    cluster.wait_state(first, ChainState.STOPPED, timeout=30)

    a = _job_id(cluster.cli("submit", "-f", "--name", "dup", "python", STEPS, "600", "0.1", cwd=tmp_path).stdout)
    b = _job_id(cluster.cli("submit", "-f", "--name", "dup", "python", STEPS, "600", "0.1", cwd=tmp_path).stdout)
    for args in (["stop", "dup"], ["status", "dup"]):
        r = cluster.cli(*args)
        assert r.returncode == 1 and a in r.stderr and b in r.stderr and "by its id" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert {cluster.job(j).state for j in (a, b)} <= {ChainState.QUEUED, ChainState.RUNNING}
    for j in (a, b):
        assert cluster.cli("stop", j).returncode == 0
        cluster.wait_state(j, ChainState.STOPPED, timeout=30)


def test_a_job_its_quota_can_never_hold_is_refused_at_submit(cluster, tmp_path):
    assert cluster.cli("quota", "set", "carol", "LOW", "1", user="root").returncode == 0
    try:
        r = cluster.cli("submit", "-n", "2", "-p", "LOW", "bash", "-c", "true", cwd=tmp_path, user="carol")
        assert r.returncode != 0 and "quota at LOW in group 'default' is 1" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert not [j for j in cluster.run(lambda api: api.list(), user="carol") if j.spec.user == "carol"]
        elastic = cluster.cli("submit", "-n", "1:2", "-p", "LOW", "bash", "-c", "true", cwd=tmp_path, user="carol")
        assert elastic.returncode == 0, elastic.stderr  # its minimum fits
        cluster.wait_state(_job_id(elastic.stdout), ChainState.SUCCEEDED)
    finally:
        cluster.cli("quota", "set", "carol", "LOW", "-1", user="root")


def _rows(text: str) -> dict[str, str]:
    """Table rows by their first cell."""
    return {line.split()[0]: line for line in text.splitlines()[1:] if line.strip()}


def test_nodes_shows_why_a_node_was_drained(cluster):
    assert cluster.cli("node", "drain", "node-1", "--reason", "bad fan, ticket 42", user="root").returncode == 0
    try:
        table = cluster.cli("nodes").stdout
        assert table.splitlines()[0].split()[-1] == "REASON"
        row = _rows(table)["node-1"]
        assert row.split()[2] == "drained" and row.endswith("bad fan, ticket 42"), table
        assert not _rows(table)["node-0"].endswith("ticket 42")
    finally:
        assert cluster.cli("node", "undrain", "node-1", user="root").returncode == 0


def test_ps_shows_what_an_elastic_job_holds(cluster, tmp_path):
    blocker = _job_id(cluster.cli("submit", "--name", "blocker", "python", STEPS, "600", "0.1", cwd=tmp_path).stdout)
    cluster.wait_state(blocker, ChainState.RUNNING)
    elastic = _job_id(cluster.cli("submit", "-n", "1:2", "--name", "stretchy", "python", STEPS, "600", "0.1",
                                  cwd=tmp_path).stdout)
    try:
        assert len(cluster.wait_state(elastic, ChainState.RUNNING).nodes) == 1
        row = _rows(cluster.cli("ps").stdout)[elastic]
        assert "  1 of 1-2  " in row, row
    finally:
        for j in (elastic, blocker):
            cluster.cli("stop", j)
            cluster.wait_state(j, ChainState.STOPPED, timeout=30)


def test_a_down_node_shows_its_last_figures_as_stale(cluster):
    cluster.local.kill("agent-node-1")
    try:
        def down():
            row = _rows(cluster.cli("nodes").stdout)["node-1"]
            return row if row.split()[2] == "down" else None

        row = cluster.wait(down, 30, "node-1 to be down", poll=0.5)
        assert re.search(r"\(\d/8\)\s+\(\d+%\)", row), row  # the last figures, marked
        assert "no heartbeat for" in row and "figures are from then" in row, row
        assert "no heartbeat" not in _rows(cluster.cli("nodes").stdout)["node-0"]
    finally:
        cluster.local.start_agent(1)
        cluster.wait(lambda: _rows(cluster.cli("nodes").stdout)["node-1"].split()[2] == "up", 30, "node-1 back")


def test_why_is_cut_to_the_terminal_width_only(cluster, tmp_path, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    blocker = _job_id(cluster.cli("submit", "-n", "2", "-p", "HIGH", "--name", "wide-blocker", "python", STEPS,
                                  "600", "0.1", cwd=tmp_path).stdout)
    waiter = _job_id(cluster.cli("submit", "-n", "2", "-p", "LOW", "--name", "waiter", "python", STEPS, "1", "0",
                                 cwd=tmp_path).stdout)
    try:
        cluster.wait_state(blocker, ChainState.RUNNING)
        reason = cluster.wait(lambda: (r := cluster.job(waiter).reason).startswith("waiting for nodes") and r,
                              30, "the waiting job's reason")
        assert len(reason) > 60

        def ps(**env):
            return cluster.cli_env({"HFAI_USER": "tester", **env}, "ps").stdout

        assert _rows(ps(COLUMNS="300"))[waiter].endswith(reason)
        assert _rows(ps())[waiter].endswith(reason)  # to a pipe: whole, for grep
        narrow = ps(COLUMNS="110")
        assert all(len(line) <= 110 for line in narrow.splitlines()), narrow
        assert _rows(narrow)[waiter].endswith("…")
    finally:
        for j in (waiter, blocker):
            cluster.cli("stop", j)
            cluster.wait_state(j, ChainState.STOPPED, timeout=30)


def test_help_documents_submission_options_and_local_nodes(cluster):
    python_help = " ".join(cluster.cli("python", "--help").stdout.split())
    for option in ("-n, --nodes", "-p, --priority", "-g, --group", "-e, --env K=V", "-i, --env-name", "-f, --force"):
        assert option in python_help, python_help
    assert "--nodes INTEGER RANGE Agents to start" in " ".join(cluster.cli("local", "up", "--help").stdout.split())
