"""The pure parts of the everyday commands (issue 13): ps filters and columns, the --json shapes,
`hfai quota` rows, where `logs --tail N` starts, `--timestamps`, and that hfai.client stays light."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from hfai.api.client import JobFilter, _line_start
from hfai.cli import render
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import ChainState, JobEvent, JobRecord, JobSpec, QuotaEntry, QuotaTable

SPEC = JobSpec(name="train-a", entrypoint=("python", "train.py"), workdir="/w", nodes=2, user="alice")
JOB = JobRecord(id="j1", spec=SPEC, state=ChainState.QUEUED, submit_ts=100.0, reason="waiting")


def _job(id: str, state: ChainState, user: str = "alice", name: str = "train-a", **changes) -> JobRecord:
    spec = dataclasses.replace(SPEC, user=user, name=name)
    return dataclasses.replace(JOB, id=id, spec=spec, state=state, **changes)


JOBS = [_job("q", ChainState.QUEUED), _job("r", ChainState.RUNNING, user="bob", name="eval-1", nodes=("n1", "n2")),
        _job("s", ChainState.SUCCEEDED, name="train-b"), _job("f", ChainState.FAILED, user="bob")]


def _shown(f: JobFilter) -> list[str]:
    return [j.id for j in JOBS if f.match(j)]


def test_filters_by_user_state_and_name():
    assert _shown(JobFilter.of()) == ["q", "r"]  # active jobs only, everyone's
    assert _shown(JobFilter.of(finished=True)) == ["q", "r", "s", "f"]
    assert _shown(JobFilter.of(users=["bob"], finished=True)) == ["r", "f"]
    assert _shown(JobFilter.of(states=["Succeeded", "failed"])) == ["s", "f"]
    assert _shown(JobFilter.of(states=["active"], finished=True)) == ["q", "r"]
    assert _shown(JobFilter.of(names=["train-*"], finished=True)) == ["q", "s", "f"]
    assert _shown(JobFilter.of(names=["TRAIN-*"])) == []  # globs are case-sensitive, like names


def test_the_server_does_what_the_list_request_can():
    mine = JobFilter.of(users=["alice"]).request("alice")
    assert not mine.all_users and not mine.include_finished
    assert JobFilter.of(users=["bob"]).request("alice").all_users  # another user's: matched here
    assert JobFilter.of(states=["failed"]).request("alice").include_finished
    assert not JobFilter.of(states=["queued", "running"]).request("alice").include_finished


def test_unknown_state_and_columns_are_refused():
    with pytest.raises(InvalidRequest, match="unknown state 'sleeping'.*active"):
        JobFilter.of(states=["sleeping"])
    with pytest.raises(InvalidRequest, match="unknown column 'colour'"):
        render.parse_columns("id,colour")
    with pytest.raises(InvalidRequest, match="no columns"):
        render.parse_columns(" , ")
    assert render.parse_columns("ID, state,why") == ("id", "state", "why")


def test_every_column_renders_every_state():
    cols = tuple(render.JOB_COLUMNS)
    text = render.jobs_table(JOBS, now=200.0, columns=cols)
    header, *rows = text.splitlines()
    assert header.split() == [render.JOB_COLUMNS[c].header for c in cols] and len(rows) == len(JOBS)


def test_custom_columns_and_a_cut_why():
    long = dataclasses.replace(JOB, reason="x" * 200)
    assert render.jobs_table([long], now=200.0, columns=("id", "why")).splitlines()[1] == "j1  " + "x" * 200
    cut = render.jobs_table([long], now=200.0, width=80).splitlines()[1]
    assert len(cut) <= 80 and cut.endswith("…")
    assert render.jobs_table([long], now=200.0, width=80, columns=("why", "id")).startswith("WHY")


def test_runtime_counts_every_run():
    running = dataclasses.replace(JOB, state=ChainState.RUNNING, run_s=50.0, started_ts=150.0)
    assert render.run_seconds(running, now=200.0) == 100.0
    history = (JobEvent(ts=150.0, state=ChainState.RUNNING), JobEvent(ts=170.0, state=ChainState.SUCCEEDED))
    done = dataclasses.replace(running, state=ChainState.SUCCEEDED, ended_ts=170.0, history=history)
    assert render.run_seconds(done, now=500.0) == 70.0
    requeued = (JobEvent(ts=160.0, state=ChainState.SUSPENDED), JobEvent(ts=170.0, state=ChainState.STOPPED))
    stopped = dataclasses.replace(done, state=ChainState.STOPPED, history=requeued, run_s=60.0)
    assert render.run_seconds(stopped, now=500.0) == 60.0  # its last run was counted when it was requeued


def test_job_json_is_plain_data_with_the_documented_keys():
    row = render.job_json(JOBS[1], now=200.0)
    assert json.loads(json.dumps(row)) == row
    assert list(row) == ["id", "name", "user", "group", "state", "reason", "priority", "priority_name", "nodes",
                         "min_nodes", "max_nodes", "nodes_held", "last_nodes", "held_by", "submitted", "started",
                         "ended", "runtime_s", "runs", "suspend_count", "whole_life_state", "command", "workdir",
                         "env_name", "env", "after", "time_limit_s", "retries", "retried", "array_id", "array_index",
                         "peak_memory_bytes", "cpu_s", "watchdog"]
    assert row["nodes_held"] == ["n1", "n2"] and row["started"] is None and row["held_by"] is None
    assert "history" in render.job_json(JOB, history=True)
    assert "\\u001b" in render.dumps([{"name": "x\x1b[2J"}])  # no raw escape reaches a terminal


def test_quota_rows_put_my_limits_next_to_my_use():
    table = QuotaTable(entries=(QuotaEntry("alice", 10, "*", 4), QuotaEntry("*", 0, "gpu", 2),
                                QuotaEntry("bob", 30, "*", 9)))
    mine = [_job("r1", ChainState.RUNNING, nodes=("n1", "n2")), _job("w", ChainState.QUEUED),
            _job("x", ChainState.RUNNING, user="bob", nodes=("n3",)), _job("d", ChainState.SUCCEEDED)]
    rows = render.quota_use("alice", table, mine, ["default", "gpu"])
    got = {(r.priority, r.group): (r.limit, r.used, r.waiting) for r in rows}
    assert got == {(10, "default"): (4, 2, 2), (10, "gpu"): (4, 0, 0), (0, "gpu"): (2, 0, 0)}
    text = render.quota_use_table("alice", rows)
    assert any(line.split() == ["NORMAL", "default", "4", "2", "2", "2"] for line in text.splitlines()), text
    assert "no limit" in render.quota_use_table("carol", render.quota_use("carol", QuotaTable(), [], ["default"]))


@pytest.mark.parametrize("tail, lines, want", [
    (b"a\nb\nc\n", 2, 2), (b"a\nb\nc", 2, 2), (b"a\nb\nc\n", 3, None), (b"x\na\nb\nc\n", 3, 2),
    (b"\n\n", 1, 1), (b"abc\n", 1, None),
])
def test_where_the_last_lines_begin(tail, lines, want):
    assert _line_start(tail, lines) == want


def test_timestamps_prefix_each_line_once():
    s = render.LineStamper()
    first, second = s.feed(b"one\ntw", 0.0), s.feed(b"o\nthree\n", 1.5)
    lines = (first + second).decode().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["one", "two", "three"]
    assert lines[1].split(" ")[0].endswith(".000") and lines[2].split(" ")[0].endswith(".500")


def test_the_submission_api_keeps_hfai_client_light():
    code = ("import sys, hfai.client as c; assert callable(c.go_suspend) and c.receive_suspend_command() is False; "
            "assert 'nats' not in sys.modules; from hfai.client import create_experiment, Experiment; "
            "assert not {'nats', 'torch', 'click'} & set(sys.modules), sorted(sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
