"""Everyday commands through the real CLI against one local cluster (issue 13): `hfai ps` filters,
columns and --json checked against the cluster's records, `status/nodes/quota/usage --json`,
`hfai quota` (my limits next to my use), `hfai logs --tail/--timestamps` (also with -f), and the
Python submission API (hfai.client.create_experiment & co.)."""

from __future__ import annotations

import json
import re
import time

import pytest
from spine_cluster import JOBS, Cluster
from waits import wait_for

from hfai.protocol.types import ChainState

pytestmark = pytest.mark.slow

STEPS = str(JOBS / "steps.py")
# 3,000 lines of 40 bytes: 120 KB, so --tail 2000 reads back across the client's 64 KiB steps.
PRINTER = "for i in range(3000): print(f'line {i:05d} ' + 'x' * 29)"
LINES = [f"line {i:05d} " + "x" * 29 for i in range(3000)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("everyday"), nodes=2) as c:
        yield c


def hfai(cluster, *args: str, user: str = "tester", columns: str = ""):
    """The stdout of `hfai ARGS` run as ``user`` in this process (cluster.cli), which must succeed.
    A few checks run the real console script in a process of its own (cluster.cli_process)."""
    cluster.creds(user)
    r = cluster.cli_env({"HFAI_USER": user, "COLUMNS": columns or None}, *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _job_id(stdout: str) -> str:
    return stdout.split("(")[1].split(")")[0]


@pytest.fixture(scope="module")
def jobs(cluster, tmp_path_factory):
    """A finished job of tester's, a running one of tester's and one of alice's (the two nodes are
    full), and a waiting one of tester's."""
    work = tmp_path_factory.mktemp("work")
    printer = cluster.submit(["python", "-c", PRINTER], "printer", workdir=work)
    cluster.wait_state(printer.id, ChainState.SUCCEEDED)
    mine = cluster.submit(["python", STEPS, "3000", "0.1"], "sleeper-mine", workdir=work)
    theirs = cluster.submit(["python", STEPS, "3000", "0.1"], "sleeper-alice", user="alice", workdir=work)
    for j in (mine, theirs):
        cluster.wait_state(j.id, ChainState.RUNNING)
    waiter = cluster.submit(["python", STEPS, "1", "0"], "waiter", workdir=work)
    # Its record says "queued" until the controller's next round explains why it waits: the
    # checks of its reason below read that explanation.
    wait_for(lambda: cluster.job(waiter.id).reason not in ("", "queued"), timeout=30,
             what="the waiting job's reason")
    # The cluster's `down` kills whatever still runs.
    return {"printer": printer.id, "mine": mine.id, "theirs": theirs.id, "waiter": waiter.id, "work": work}


def _json(cluster, *args: str, user: str = "tester"):
    return json.loads(hfai(cluster, *args, "--json", user=user))


def test_ps_json_is_the_cluster_s_records(cluster, jobs):
    r = cluster.cli_process("ps", "-a", "--json")  # a real process
    assert r.returncode == 0, r.stderr
    listed = {j["id"]: j for j in json.loads(r.stdout)}
    records = {j.id: j for j in cluster.run(lambda api: api.list())}
    assert set(listed) == set(records) >= {jobs["printer"], jobs["mine"], jobs["theirs"], jobs["waiter"]}
    for job_id, record in records.items():
        got = listed[job_id]
        assert (got["name"], got["user"], got["state"], got["nodes"], got["priority"], got["runs"]) == (
            record.spec.name, record.spec.user, record.state.value, record.spec.nodes, record.spec.priority,
            record.run_id)
        assert got["nodes_held"] == (list(record.nodes) if record.state.holds_nodes else [])
        assert got["submitted"] == record.submit_ts and got["command"] == list(record.spec.entrypoint)
    assert listed[jobs["printer"]]["runtime_s"] > 0 and listed[jobs["printer"]]["ended"]
    assert listed[jobs["waiter"]]["started"] is None and listed[jobs["waiter"]]["reason"]


def test_ps_filters_exclude_what_they_should(cluster, jobs):
    def ids(*args: str) -> set[str]:
        return {j["id"] for j in _json(cluster, "ps", *args)}

    active = ids()
    assert jobs["printer"] not in active and {jobs["mine"], jobs["theirs"], jobs["waiter"]} <= active
    assert ids("-u", "alice") == {jobs["theirs"]}
    assert ids("--mine", "--state", "running") == {jobs["mine"]}
    assert ids("--state", "queued", "--state", "SUCCEEDED") == {jobs["waiter"], jobs["printer"]}
    assert ids("--name", "sleeper-*", "--all-users", "-u", "tester") == {jobs["mine"], jobs["theirs"]}
    assert hfai(cluster, "ps", "--name", "nothing-like-it*").strip() == "no jobs match"


def test_ps_custom_columns_and_wide(cluster, jobs):
    header, *rows = hfai(cluster, "ps", "-a", "-o", "id,STATE,runtime,submitted,held,where").splitlines()
    assert header.split() == ["ID", "STATE", "RUNTIME", "SUBMITTED", "HELD", "WHERE"]
    cells = {row.split()[0]: row.split() for row in rows}
    assert cells[jobs["printer"]][1] == "succeeded" and cells[jobs["waiter"]][1:3] == ["queued", "0s"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", cells[jobs["mine"]][3])
    assert cells[jobs["mine"]][5] == cluster.job(jobs["mine"]).nodes[0] and cells[jobs["waiter"]][4:] == ["-", "-"]

    why = cluster.job(jobs["waiter"]).reason
    assert len(why) > 40, why  # long enough that an 80-column terminal cuts it
    narrow = hfai(cluster, "ps", columns="80")
    assert why not in narrow and "…" in narrow
    assert why in hfai(cluster, "ps", "--wide", columns="80")


def test_a_held_job_shows_in_ps_and_status(cluster, jobs):
    waiter = jobs["waiter"]
    hfai(cluster, "hold", waiter)
    try:
        held = _json(cluster, "ps", "--held")
        assert [(j["id"], j["held_by"]) for j in held] == [(waiter, "tester")]
        assert "held       by tester" in hfai(cluster, "status", waiter)
        row = {line.split()[0]: line.split() for line in hfai(cluster, "ps", "-o", "id,held").splitlines()[1:]}
        assert row[waiter] == [waiter, "tester"] and row[jobs["mine"]] == [jobs["mine"], "-"]
    finally:
        hfai(cluster, "release", waiter)
    assert _json(cluster, "ps", "--held") == []


@pytest.mark.parametrize("args, says", [
    (["ps", "--state", "sleeping"], "unknown state 'sleeping'"),
    (["ps", "-o", "id,colour"], "unknown column 'colour'"),
    (["ps", "-o", ","], "no columns given"),
    (["logs", "x", "--tail", "-3"], "--tail"),
])
def test_mistakes_get_one_line_and_a_non_zero_exit(cluster, args, says):
    r = cluster.cli(*args)
    assert r.returncode != 0 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len([line for line in r.stderr.splitlines() if line.startswith("Error")]) == 1


def test_status_nodes_and_quota_ls_json(cluster, jobs):
    status = _json(cluster, "status", jobs["mine"])
    record = cluster.job(jobs["mine"])
    assert status["id"] == record.id and status["state"] == "running" and status["nodes_held"] == list(record.nodes)
    assert [h["state"] for h in status["history"]] == [e.state.value for e in record.history]

    nodes = {n["name"]: n for n in _json(cluster, "nodes")}
    assert set(nodes) == {"node-0", "node-1"}
    held = {job for n in nodes.values() for job in n["jobs"]}
    assert {jobs["mine"], jobs["theirs"]} <= held and jobs["waiter"] not in held
    assert all(n["state"] == "up" and n["gpus"] == 8 and not n["stale"] for n in nodes.values())

    hfai(cluster, "quota", "set", "alice", "HIGH", "3", user="root")
    try:
        quotas = _json(cluster, "quota", "ls")
        assert {"user": "alice", "priority": 30, "priority_name": "HIGH", "group": "*", "nodes": 3} in quotas
    finally:
        hfai(cluster, "quota", "set", "alice", "HIGH", "-1", user="root")
    assert isinstance(_json(cluster, "usage"), list)


def test_quota_shows_my_limits_next_to_my_use(cluster, jobs):
    hfai(cluster, "quota", "set", "tester", "NORMAL", "2", user="root")
    hfai(cluster, "quota", "set", "*", "LOW", "5", "-g", "default", user="root")
    try:
        rows = {(r["priority_name"], r["group"]): r for r in _json(cluster, "quota")}
        assert rows[("NORMAL", "default")] == {"priority": 10, "priority_name": "NORMAL", "group": "default",
                                               "limit": 2, "used": 1, "waiting": 1}
        assert rows[("LOW", "default")]["limit"] == 5 and rows[("LOW", "default")]["used"] == 0
        assert ("HIGH", "default") not in rows  # no quota there and nothing of mine
        table = cluster.cli_process("quota", "show").stdout  # a real process
        assert "quotas of tester" in table
        assert any(line.split() == ["NORMAL", "default", "2", "1", "1", "1"] for line in table.splitlines()), table
        alice = {r["priority_name"]: r for r in _json(cluster, "quota", user="alice")}
        assert alice["NORMAL"]["limit"] is None and alice["NORMAL"]["used"] == 1  # tester's quota is not hers
    finally:
        hfai(cluster, "quota", "set", "tester", "NORMAL", "-1", user="root")
        hfai(cluster, "quota", "set", "*", "LOW", "-1", "-g", "default", user="root")


def test_logs_tail_returns_exactly_the_last_lines(cluster, jobs):
    printer = jobs["printer"]
    lines = cluster.log(printer).splitlines()  # the job's 3,000 lines between the agent's run lines
    assert len(lines) == len(LINES) + 2 and lines[1:-1] == LINES
    r = cluster.cli_process("logs", printer, "--tail", "2000")  # a real process
    assert r.returncode == 0 and r.stdout.splitlines() == lines[-2000:], r.stderr
    for n in (1, 7):
        assert hfai(cluster, "logs", printer, "--tail", str(n)).splitlines() == lines[-n:]
    assert hfai(cluster, "logs", printer, "--tail", "0") == ""
    assert hfai(cluster, "logs", printer, "-n", "5000").splitlines() == lines

    stamped = hfai(cluster, "logs", printer, "--tail", "3", "--timestamps").splitlines()
    assert len(stamped) == 3
    for line, want in zip(stamped, lines[-3:], strict=True):
        stamp, _, text = line.partition(" ")
        assert text == want and re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}", stamp), line
        assert abs(time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.time()) < 120


def test_logs_tail_with_follow_prints_the_tail_then_what_follows(cluster, jobs):
    script = ("import time\nfor i in range(50): print('before', i)\nprint('pause', flush=True)\n"
              "time.sleep(4)\nfor i in range(3): print('after', i)\n")
    (jobs["work"] / "pause.py").write_text(script)
    # HIGH: it takes a node from a NORMAL job (both nodes are busy).
    r = cluster.cli("submit", "-p", "HIGH", "--name", "pauser", "python", "pause.py", cwd=jobs["work"])
    assert r.returncode == 0, r.stderr
    job_id = _job_id(r.stdout)
    # The line "pause" itself: the agent's header line names the job, "pauser", before the job prints.
    cluster.wait(lambda: "pause" in cluster.log(job_id).splitlines() if cluster.job(job_id).last_nodes else False,
                 60, "the first lines")
    followed = cluster.cli("logs", job_id, "--tail", "2", "-f")
    assert followed.returncode == 0, followed.stderr
    lines = cluster.log(job_id).splitlines()
    assert followed.stdout.splitlines() == lines[lines.index("before 49"):]
    assert followed.stdout.splitlines()[:5] == ["before 49", "pause", "after 0", "after 1", "after 2"]


def test_python_api_submits_waits_reads_logs_and_stops(cluster, jobs, monkeypatch):
    import os

    from hfai.client import Experiment, create_experiment, get_experiment, list_experiments, submit
    from hfai.protocol.errors import InvalidRequest, NotFound, Timeout

    cluster.creds("tester")
    for key in [k for k in os.environ if k.startswith("HFAI_NATS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("HFAI_CONFIG", str(cluster.local.config_path))
    monkeypatch.setenv("HFAI_USER", "tester")
    monkeypatch.chdir(jobs["work"])
    (jobs["work"] / "hello.py").write_text("import sys\nfor i in range(20): print('hello', i, sys.argv[1:])\n")

    exp = create_experiment("hello.py", ["--lr", "0.1"], name="py-hello", priority="HIGH")
    assert isinstance(exp, Experiment) and exp.name == "py-hello" and exp.record.spec.priority == 30
    assert exp.wait(timeout=60, poll_s=0.2) is ChainState.SUCCEEDED and exp.state is ChainState.SUCCEEDED
    *last, footer = exp.logs(tail=3).splitlines()  # the agent ends each run's log with a line of its own
    assert last == ["hello 18 ['--lr', '0.1']", "hello 19 ['--lr', '0.1']"] and "exited with code 0" in footer
    assert exp.logs() == cluster.log(exp.id) and exp.suspend_count == 0

    long = submit(["python", STEPS, "3000", "0.1"], name="py-long", priority="HIGH")  # preempts a NORMAL job
    assert get_experiment("py-long").id == long.id
    assert [e.id for e in list_experiments(names=["py-*"])] == [long.id]
    assert {e.id for e in list_experiments(names=["py-*"], finished=True)} == {exp.id, long.id}
    with pytest.raises(Timeout):
        long.wait(timeout=0.5, poll_s=0.1)
    assert long.stop() in (ChainState.STOPPING, ChainState.STOPPED)
    assert long.wait(timeout=60, poll_s=0.2) is ChainState.STOPPED

    with pytest.raises(NotFound):
        get_experiment("no-such-experiment")
    with pytest.raises(InvalidRequest):
        create_experiment("missing.py")
    with pytest.raises(InvalidRequest):
        submit(["true"], nodes="0")
