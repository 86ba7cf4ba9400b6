"""Pure parts of hfai-web, usage accounting and the metrics scan: no cluster, no I/O."""

from __future__ import annotations

import pytest

from hfai.api.present import csv_lines, totals
from hfai.controller.metrics import latencies
from hfai.controller.usage import merge, runs_of, usage_rows
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import (
    ChainState,
    GpuStat,
    JobEvent,
    JobRecord,
    JobSpec,
    NodeInfo,
    NodeRecord,
    NodeState,
    QuotaEntry,
    QuotaTable,
    UsageEntry,
)
from hfai.web import views
from hfai.web.series import Sample, cluster_series, downsample, gpu_lines, heat_map, job_gpu, per_gpu, sample_of

DAY = 86400.0
T0 = 20000 * DAY  # a UTC midnight


def job(history, run_id=0, nodes=(), last_nodes=(), spec_nodes=2, user="alice", priority=10, jid="j1",
        name="train", **spec) -> JobRecord:
    events = tuple(JobEvent(ts=ts, state=state) for ts, state in history)
    s = JobSpec(name=name, entrypoint=("x",), workdir="/", nodes=spec_nodes, priority=priority, user=user, **spec)
    return JobRecord(id=jid, spec=s, state=events[-1].state, submit_ts=events[0].ts, run_id=run_id, nodes=nodes,
                     last_nodes=last_nodes, history=events)


Q, R, SG, SD, OK = (ChainState.QUEUED, ChainState.RUNNING, ChainState.SUSPENDING, ChainState.SUSPENDED,
                    ChainState.SUCCEEDED)


def test_runs_of_a_suspended_and_resumed_job():
    j = job([(T0, Q), (T0 + 10, R), (T0 + 100, SG), (T0 + 110, SD), (T0 + 200, R), (T0 + 300, OK)], run_id=2,
            last_nodes=("a", "b"))
    runs = runs_of(j, now=T0 + 1000)
    assert [(e.run_id, e.start_ts, e.end_ts, e.nodes, ended) for e, ended in runs] == [
        (1, T0 + 10, T0 + 110, 2, True), (2, T0 + 200, T0 + 300, 2, True)]


def test_a_running_run_counts_until_now_and_is_not_ended():
    j = job([(T0, Q), (T0 + 10, R)], run_id=1, nodes=("a",), spec_nodes=1)
    [(entry, ended)] = runs_of(j, now=T0 + 70)
    assert not ended and entry.end_ts == T0 + 70 and entry.nodes == 1


def test_a_history_cut_to_its_last_events_numbers_runs_from_the_latest():
    j = job([(T0 + 100, SD), (T0 + 200, R), (T0 + 300, OK)], run_id=7, last_nodes=("a", "b"))
    assert [e.run_id for e, _ in runs_of(j, T0 + 400)] == [7]


def test_usage_rows_split_a_run_at_utc_midnight_and_count_gpu_hours():
    e = UsageEntry(job_id="j", run_id=1, user="alice", group="g", priority=30, nodes=2,
                   start_ts=T0 + DAY - 1800, end_ts=T0 + DAY + 3600)
    rows = usage_rows([e], since_ts=0, until_ts=T0 + 2 * DAY)
    assert [(r.day, r.gpu_hours, r.runs) for r in rows] == [("2024-10-04", 8.0, 1), ("2024-10-05", 16.0, 1)]
    clipped = usage_rows([e], since_ts=T0 + DAY, until_ts=T0 + 2 * DAY)
    assert [r.gpu_hours for r in clipped] == [16.0]
    assert totals(rows, "user") == {"alice": 24.0}
    assert csv_lines(rows)[1] == "2024-10-04,alice,g,HIGH,8.000,1"


def test_a_stored_entry_wins_over_the_live_records_guess():
    j = job([(T0, Q), (T0 + 10, R), (T0 + 20, OK)], run_id=1, spec_nodes=4)  # no nodes left on the record
    stored = UsageEntry(job_id="j1", run_id=1, user="alice", group="default", priority=10, nodes=2,
                        start_ts=T0 + 10, end_ts=T0 + 20)
    assert merge([stored], [j], T0 + 30) == [stored]
    assert merge([], [j], T0 + 30)[0].nodes == 4


def test_latencies_seen_in_a_history():
    j = job([(T0, Q), (T0 + 5, R), (T0 + 50, SG), (T0 + 53, SD), (T0 + 60, R)])
    got = {(h, round(s, 3)) for h, _key, s in latencies(j)}
    assert got == {("submit_to_running", 5.0), ("suspend_to_released", 3.0)}


def test_job_rows_filter_and_sort():
    jobs = [job([(T0 + i, Q)], jid=f"j{i}", user=u, priority=p, name=n)
            for i, (u, p, n) in enumerate([("alice", 30, "big-run"), ("bob", 0, "eval"), ("alice", 0, "run-2")])]
    assert [r["id"] for r in views.job_rows(jobs, user="alice", sort="submitted", desc=False)] == ["j0", "j2"]
    assert [r["id"] for r in views.job_rows(jobs, priority="LOW", sort="name", desc=False)] == ["j1", "j2"]
    assert [r["id"] for r in views.job_rows(jobs, name="run")] == ["j2", "j0"]
    assert views.job_rows(jobs, state="running") == []
    with pytest.raises(InvalidRequest):
        views.job_rows(jobs, priority="URGENT")


def test_quotas_next_to_use():
    running = job([(T0, Q), (T0 + 1, R)], run_id=1, nodes=("a", "b"), priority=30)
    table = QuotaTable(entries=(QuotaEntry(user="alice", priority=30, group="*", nodes=4),
                                QuotaEntry(user="bob", priority=30, group="*", nodes=1)))
    assert [(q["user"], q["used"], q["quota"]) for q in views.quotas_vs_use(table, [running])] == [
        ("alice", 2, 4), ("bob", 0, 1)]
    assert views.node_use([running], "priority") == {"HIGH": 2}


def _record(ts, util, name="n0"):
    gpus = tuple(GpuStat(index=i, name="sim", utilization=u, memory_used=50, memory_total=100, temperature=40,
                         power_w=100) for i, u in enumerate(util))
    return NodeRecord(name=name, group="g", address="x", ts=ts, seq=1, gpus=gpus)


def test_per_gpu_series_and_a_nodes_chart():
    samples = [sample_of(_record(T0 + i, (i * 10.0, 100.0))) for i in range(5)]
    util = per_gpu(samples, "util", since=T0 + 1)
    assert util[0] == [(T0 + i, i / 10) for i in range(1, 5)] and len(util) == 2
    assert per_gpu(samples, "mem", since=0)[1][0] == (T0, 0.5)
    lines = gpu_lines(samples, since=T0 + 1)
    assert [line["v"] for line in lines["util"]] == [[10.0, 20.0, 30.0, 40.0], [100.0] * 4]  # percent
    assert lines["mem"][0]["v"] == [50.0] * 4 and lines["util"][0]["ts"] == [T0 + i for i in range(1, 5)]
    assert len(gpu_lines([sample_of(_record(T0 + i, (1.0,))) for i in range(1000)], 0, most=50)["util"][0]["v"]) == 50
    assert len(downsample([(float(i), 1.0) for i in range(1000)], 10)) == 10
    assert Sample(ts=1, util=(), mem=()) == Sample(ts=1, util=(), mem=())


def test_the_heat_map_has_a_row_per_node_and_gaps_where_no_heartbeat_came():
    samples = {"a": [sample_of(_record(T0 + 5, (50.0, 100.0), "a")), sample_of(_record(T0 + 15, (0.0, 0.0), "a"))],
               "b": [sample_of(_record(T0 + 125, (20.0,), "b"))]}
    hm = heat_map(samples, ["a", "b", "c"], T0, T0 + 180, bucket_s=60)
    assert hm["nodes"] == ["a", "b", "c"] and hm["x"] == [T0 + 30, T0 + 90, T0 + 150, T0 + 210]
    assert hm["util"] == [[37.5, None, None, None], [None, None, 20.0, None], [None] * 4]  # mean of GPUs, of samples
    assert hm["mem"][0][0] == 50.0


def test_a_jobs_gpus_over_its_runs_are_cut_between_runs():
    samples = {"a": [sample_of(_record(T0 + t, (80.0, 60.0), "a")) for t in range(0, 100, 10)]}
    got = job_gpu(samples, [(("a",), T0 + 55, T0 + 75), (("a",), T0, T0 + 25)])
    [line] = got["nodes"]
    assert line["node"] == "a" and line["ts"] == [T0, T0 + 10, T0 + 20, T0 + 55, T0 + 60, T0 + 70]
    assert line["util"] == [70.0, 70.0, 70.0, None, 70.0, 70.0] and line["mem"][3] is None
    assert job_gpu(samples, [(("b",), T0, T0 + 50)]) == {"nodes": []}  # no telemetry: no line, not a flat zero


def test_a_many_node_jobs_gpus_are_its_nodes_mean_lowest_and_highest():
    samples = {f"n{i}": [sample_of(_record(T0 + t, (float(10 * i),), f"n{i}")) for t in range(0, 100, 10)]
               for i in range(10)}
    lines = job_gpu(samples, [(tuple(samples), T0, T0 + 100)], most=10)["nodes"]
    assert [line["node"] for line in lines] == ["mean of 10 nodes", "lowest node", "highest node"]
    assert lines[0]["util"][0] == 45.0 and lines[1]["util"][0] == 0.0 and lines[2]["util"][0] == 90.0
    assert len(lines[0]["ts"]) == 10 and lines[0]["mem"][0] == 50.0 and None not in lines[0]["util"]
    # Two runs: a gap between them, and none inside a run even where a step had no sample.
    two = job_gpu(samples, [(tuple(samples), T0, T0 + 35), (tuple(samples), T0 + 60, T0 + 100)], most=200)["nodes"]
    assert two[0]["util"].count(None) == 1 and len(two[0]["util"]) == 4 + 1 + 4
    assert len(job_gpu(samples, [(("n1", "n2"), T0, T0 + 100)])["nodes"]) == 2  # few nodes: one line each


def test_cluster_series_from_histories():
    a = job([(T0, Q), (T0 + 10, R), (T0 + 20, OK)], run_id=1, last_nodes=("x",), spec_nodes=1)
    b = job([(T0, Q), (T0 + 30, R)], run_id=1, nodes=("y", "z"), jid="b")
    queue, used = cluster_series([a, b], T0 + 5, T0 + 35, points=4)  # at +5, +15, +25, +35
    assert [v for _, v in queue] == [2.0, 1.0, 1.0, 0.0]
    assert [v for _, v in used] == [0.0, 1.0, 0.0, 2.0]


def test_a_down_node_is_stale_and_keeps_its_last_figures():
    info = NodeInfo(record=_record(T0, (80.0,)), state=NodeState.DOWN, age_s=120.0, reason="fan")
    row = views.node_row(info, T0 + 120)
    assert row["stale"] and row["last_seen"] == T0 and row["util"] == 80.0 and row["reason"] == "fan"


def test_the_cli_and_the_usage_command_import_no_web_or_metrics_library():
    import subprocess
    import sys

    code = ("import sys, hfai, hfai.cli.main, hfai.cli.usage, hfai.controller.usage; "
            "print(sorted(m for m in ('aiohttp', 'prometheus_client', 'selenium', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_nodes_health_line_names_its_fault_its_last_check_and_what_containment_lacks():
    import dataclasses

    from hfai.protocol import reasons
    from hfai.protocol.types import GpuFault, HealthCheck

    fault = GpuFault(ts=T0, why=reasons.gpu_fault(gpu=3, xid=79, meaning="fell off the bus",
                                                kind="hardware", node="n0"), hardware=True)
    sick = dataclasses.replace(_record(T0, (0.0,)), fault=fault, faults=(fault,), containment="bwrap, cgroup v1",
                               check=HealthCheck(ts=T0, ok=False, duration_s=1.5, detail="gemm on GPU 3: wrong result"))
    health = views.node_row(NodeInfo(record=sick, state=NodeState.DRAINED, age_s=1.0), T0)["health"]
    assert health.startswith("fault: ") and "Xid 79 on GPU 3" in health
    assert "check failed at " in health and "gemm on GPU 3: wrong result" in health
    assert "1 recent fault(s)" in health and "cgroup" not in health  # fully contained: nothing to say
    well = dataclasses.replace(_record(T0, (0.0,)), check=HealthCheck(ts=T0, ok=True, duration_s=0.01),
                               containment="no container, cgroup v1; containers off ([agent] container = \"none\")")
    health = views.node_row(NodeInfo(record=well, state=NodeState.UP, age_s=1.0), T0)["health"]
    assert "check passed in 0.01s" in health and "containers off" in health
    assert views.node_row(NodeInfo(record=_record(T0, (0.0,)), state=NodeState.UP, age_s=1.0), T0)["health"] == ""
