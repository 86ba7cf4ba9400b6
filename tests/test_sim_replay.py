"""The trace simulator, its baselines, the trace format and generator, and ``hfai sim``."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from hfai import sim
from hfai.controller.policy import HFAI, FunctionPolicy, JobView, NodeView, PolicyConfig, Start, Suspend, Wait
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import ChainState, Priority
from hfai.sim import SimConfig, Simulator, TraceError, TraceJob, jain, read_trace, simulate, tracegen, write_trace

LOW, NORMAL, HIGH = Priority.LOW.value, Priority.NORMAL.value, Priority.HIGH.value
EXACT = SimConfig(checkpoint_s=10.0, restart_s=20.0, tick_s=1.0, wake_s=5.0)


def by_submit(result_jobs):
    return {j.trace.submit_s: j for j in result_jobs}


# ------------------------------------------------------------------------------- replay


def test_a_lone_job_runs_for_its_duration():
    r = simulate([TraceJob(0.0, 100.0, 2)], 2, "hfai", EXACT)
    assert (r.avg_jct_s, r.avg_queue_s, r.interrupts_per_job) == (100.0, 0.0, 0.0)


def test_preemption_costs_checkpoint_and_restart_time():
    """LOW runs 0..50, checkpoints 50..60; HIGH runs 60..160; LOW restores 160..180 and runs its
    remaining 50 s: it ends at 230."""
    trace = [TraceJob(0.0, 100.0, 1, LOW, "a"), TraceJob(50.0, 100.0, 1, HIGH, "b")]
    s = Simulator(trace, 1, HFAI, EXACT, name="hfai")
    r = s.run()
    low, high = by_submit(s.jobs)[0.0], by_submit(s.jobs)[50.0]
    assert (low.end, high.end) == (230.0, 160.0)
    assert low.interrupts == 1 and r.interrupts_per_job == 0.5
    assert r.overhead == pytest.approx((10 + 20) / 230)


def test_fifo_never_preempts_and_the_head_blocks():
    trace = [TraceJob(0.0, 100.0, 1, LOW, "a"), TraceJob(1.0, 100.0, 2, HIGH, "b"), TraceJob(2.0, 10.0, 1)]
    s = Simulator(trace, 2, sim.FIFO, EXACT, name="fifo")
    s.run()
    jobs = by_submit(s.jobs)
    assert jobs[0.0].interrupts == 0 and jobs[0.0].end == 100.0
    assert jobs[1.0].first_start == 100.0  # waits for the whole cluster
    assert jobs[2.0].first_start >= 200.0  # no backfill past the head


def _long_then_short_under_las(threshold_node_s: float) -> dict:
    """A 1,000 s job, then at 100 s a 10 s one, on one node, under LAS with one threshold."""
    trace = [TraceJob(0.0, 1000.0, 1, user="a"), TraceJob(100.0, 10.0, 1, user="b")]
    s = Simulator(trace, 1, sim.make_las([threshold_node_s]), EXACT, name="las")
    s.run()
    return by_submit(s.jobs)


def test_las_prefers_the_job_with_less_attained_service():
    jobs = _long_then_short_under_las(50.0)
    assert jobs[0.0].interrupts == 1
    assert jobs[100.0].end < 200.0


def test_las_demotes_a_running_job_when_its_service_crosses_a_threshold():
    """Nothing else changes: the running job's own service moves it to the next queue at 500
    node-seconds, and the job waiting in the first queue then takes its node."""
    jobs = _long_then_short_under_las(500.0)
    assert jobs[0.0].interrupts == 1
    assert 500.0 <= jobs[100.0].first_start < 600.0


def test_hfai_time_slices_between_users():
    config = SimConfig(checkpoint_s=0.0, restart_s=0.0, tick_s=1.0, wake_s=5.0, policy=PolicyConfig(slice_s=100.0))
    s = Simulator([TraceJob(0.0, 1000.0, 1, user="a"), TraceJob(10.0, 50.0, 1, user="b")], 1, HFAI, config, "hfai")
    s.run()
    short = by_submit(s.jobs)[10.0]
    # The long job yields once it has had two slices of service (band 1), then the short one runs.
    assert short.end <= 10.0 + 200.0 + 50.0 + 5.0
    assert by_submit(s.jobs)[0.0].interrupts == 1


def test_elastic_job_runs_slower_on_fewer_nodes_and_grows_later():
    config = SimConfig(checkpoint_s=0.0, restart_s=0.0, tick_s=1.0, wake_s=5.0, policy=PolicyConfig(slice_s=50.0))
    trace = [TraceJob(0.0, 60.0, 2, user="a"), TraceJob(0.0, 100.0, 1, user="b", max_nodes=4)]
    s = Simulator(trace, 4, HFAI, config, name="hfai")
    s.run()
    elastic = next(j for j in s.jobs if j.trace.max_nodes)
    # 400 node-seconds of work: 2 nodes until the other job ends at 60 s (120 done), then all 4
    # (280 left, 70 s): it ends at about 130 s, not at 200 s as it would on 2 nodes.
    assert 125.0 <= elastic.end <= 140.0
    assert elastic.interrupts == 1


def _policy(decide) -> FunctionPolicy:
    """A policy that decides with ``decide`` in hfai's queue order and never by the clock."""
    return FunctionPolicy("test", decide, HFAI.ordering, lambda jobs, now, config: now)


def test_the_simulator_rejects_a_policy_that_gives_a_node_twice():
    def greedy(jobs, nodes, now, config):
        return [Start(j.id, (nodes[0].name,), "") for j in jobs if j.state.waiting]

    with pytest.raises(sim.PolicyViolation, match="given to"):
        Simulator([TraceJob(0.0, 10.0, 1), TraceJob(0.0, 10.0, 1)], 2, _policy(greedy), EXACT, "bad").run()


def test_the_simulator_rejects_a_policy_that_leaves_jobs_waiting_for_ever():
    with pytest.raises(sim.PolicyViolation, match="idle cluster"):
        Simulator([TraceJob(0.0, 10.0, 1)], 2, _policy(lambda *a: []), EXACT, "lazy").run()


def test_a_job_larger_than_the_cluster_is_a_user_error():
    with pytest.raises(InvalidRequest, match="needs 8 nodes"):
        simulate([TraceJob(0.0, 10.0, 8)], 4)
    with pytest.raises(InvalidRequest, match="unknown policy"):
        simulate([TraceJob(0.0, 10.0, 1)], 4, "sjf")


def test_utilisation_counts_only_time_when_work_waits():
    # One node, two jobs back to back: the second waits for 100 s while the node is busy.
    r = simulate([TraceJob(0.0, 100.0, 1), TraceJob(0.0, 100.0, 1)], 1, "fifo", EXACT)
    assert r.utilisation == 1.0
    # Two nodes, the 2-node job waits while one node is busy and one idle.
    r = simulate([TraceJob(0.0, 100.0, 1), TraceJob(0.0, 100.0, 2)], 2, "fifo", EXACT)
    assert r.utilisation == pytest.approx(0.5)


def test_jain_index():
    assert jain([1.0, 1.0, 1.0]) == 1.0
    assert jain([1.0, 0.0, 0.0, 0.0]) == pytest.approx(0.25)
    assert jain([]) == 1.0


def test_quantiles_and_table():
    trace = [TraceJob(float(i), 60.0 * (i + 1), 1, user=f"u{i % 3}") for i in range(20)]
    results = [simulate(trace, 4, name, EXACT) for name in ("hfai", "fifo", "las")]
    table = sim.format_table(results)
    assert table.splitlines()[0].split()[:3] == ["policy", "util", "ovh"]
    assert [line.split()[0] for line in table.splitlines()[1:]] == ["hfai", "fifo", "las"]
    for r in results:
        assert r.median_jct_s <= r.p99_jct_s and r.jobs == 20


def test_baselines_have_the_policy_signature():
    jobs = [JobView("a", "u", NORMAL, 1, 0.0, ChainState.QUEUED)]
    for policy in sim.POLICIES.values():
        out = policy.decide(jobs, [NodeView("n0")], 0.0, PolicyConfig())
        assert [type(d) for d in out] in ([Start], [Start, Wait])
    running = [JobView("r", "u", NORMAL, 1, 0.0, ChainState.RUNNING, held=("n0",), run_s=1e9)]
    assert any(isinstance(d, Suspend) for d in sim.LAS.decide(running + jobs, [NodeView("n0")], 0.0, PolicyConfig()))


def test_las_prio_puts_priority_before_attained_service():
    """las-prio: a waiting HIGH job that ran for hours takes the node of a LOW one that has not
    (blind LAS keeps the LOW one); within one priority, less service first, as in LAS."""
    low = JobView("low", "u", LOW, 1, 0.0, ChainState.RUNNING, held=("n0",), started_ts=0.0)
    high = JobView("high", "v", HIGH, 1, 0.0, ChainState.SUSPENDED, run_s=1e6)
    out = sim.LAS_PRIO.decide([low, high], [NodeView("n0")], 10.0, PolicyConfig())
    assert [(type(d), d.job_id) for d in out] == [(Suspend, "low")]
    assert sim.LAS.decide([low, high], [NodeView("n0")], 10.0, PolicyConfig()) == []
    served = JobView("served", "u", HIGH, 1, 0.0, ChainState.SUSPENDED, run_s=1e6)
    fresh = JobView("fresh", "v", HIGH, 1, 5.0, ChainState.QUEUED)
    out = sim.LAS_PRIO.decide([served, fresh], [NodeView("n0")], 10.0, PolicyConfig())
    assert [(type(d), d.job_id) for d in out] == [(Start, "fresh")]


# ------------------------------------------------------------------------------- traces


def test_trace_format_round_trip_with_optional_columns(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("# a comment\nsubmit_s,duration_s,nodes,priority,user\n5,60,2:8,high,alice\n"
                    "1,30,1\n\n2,10,4,20\n3,10,4,,bob\n")
    jobs = read_trace(path)
    assert [j.submit_s for j in jobs] == [1.0, 2.0, 3.0, 5.0]
    assert jobs[0] == TraceJob(1.0, 30.0, 1, NORMAL, "user", 0)
    assert jobs[1].priority == 20 and jobs[2].user == "bob"
    assert (jobs[3].nodes, jobs[3].max_nodes, jobs[3].priority, jobs[3].user) == (2, 8, HIGH, "alice")
    out = tmp_path / "out.csv"
    write_trace(out, jobs)
    assert read_trace(out) == jobs


@pytest.mark.parametrize("row, message", [
    ("1,x,2", "could not convert"),
    ("1,10", "3 to 6 columns"),
    ("1,10,0", "nodes must be"),
    ("1,10,8:2", "nodes must be"),
    ("-1,10,1", "submit_s must be"),
    ("1,0,1", "duration_s > 0"),
    ("1,10,1,urgent", "unknown priority"),
])
def test_bad_trace_rows_name_the_line(tmp_path, row, message):
    path = tmp_path / "bad.csv"
    path.write_text(f"0,10,1\n{row}\n")
    with pytest.raises(TraceError, match=f"line 2: .*{message}"):
        read_trace(path)


def test_missing_or_empty_trace(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "nope.csv")
    (tmp_path / "empty.csv").write_text("submit_s,duration_s,nodes\n")
    with pytest.raises(TraceError, match="no jobs"):
        read_trace(tmp_path / "empty.csv")


def test_generator_is_deterministic_heavy_tailed_and_at_the_asked_load():
    a = tracegen.generate(4000, 500, load=1.2, seed=5)
    assert a == tracegen.generate(4000, 500, load=1.2, seed=5)
    assert a != tracegen.generate(4000, 500, load=1.2, seed=6)
    durations = sorted(j.duration_s for j in a)
    assert tracegen.MIN_S <= durations[0] and durations[-1] <= tracegen.MAX_S
    assert durations[len(durations) // 2] < 3600 < sum(durations) / len(durations)  # median < 1 h < mean
    sizes = [j.nodes for j in a]
    assert set(sizes) <= {1, 2, 4, 8, 16, 32, 64} and sizes.count(1) > len(sizes) / 3
    assert len({j.user for j in a}) > 3 and len({j.priority for j in a}) > 3
    assert tracegen.offered_load(a, 500) == pytest.approx(1.2, rel=1e-4)  # exactly, not only in expectation
    assert tracegen.mean_duration_s() == pytest.approx(11_874, rel=0.01)


def test_generator_elastic_jobs_and_small_clusters():
    jobs = tracegen.generate(500, 8, elastic=1.0, seed=1)
    assert all(j.hi <= 8 for j in jobs)
    assert all(j.max_nodes == 0 or j.nodes == max(1, j.max_nodes // 2) for j in jobs)
    assert any(j.max_nodes for j in jobs)
    with pytest.raises(ValueError):
        tracegen.generate(0, 8)


# ------------------------------------------------------------------------------- the CLI


@pytest.fixture()
def cli():
    from hfai.cli.main import main

    return main


def test_cli_gen_then_replay(tmp_path, cli):
    runner = CliRunner()
    out = tmp_path / "trace.csv"
    r = runner.invoke(cli, ["sim", "gen", str(out), "--jobs", "150", "--nodes", "32", "--load", "1.2", "--seed", "3"])
    assert r.exit_code == 0, r.output
    assert "150 jobs" in r.output
    r = runner.invoke(cli, ["sim", str(out), "--nodes", "32", "--policy", "hfai", "--policy", "fifo", "--slice", "600"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[1].split()[0] == "policy" and [ln.split()[0] for ln in lines[2:4]] == ["hfai", "fifo"]
    r = runner.invoke(cli, ["sim", "run", str(out), "--nodes", "32", "--policy", "las", "--policy", "las-prio"])
    assert r.exit_code == 0, r.output
    assert [ln.split()[0] for ln in r.output.splitlines()[2:4]] == ["las", "las-prio"]


def test_cli_gen_reports_the_load_asked_for(tmp_path, cli):
    """Issue 13 defect 13: --load 1.2 reported an offered load of 1.36 (one heavy-tailed trace's
    demand strays from its expectation); the arrivals are now stretched to the asked load."""
    out = tmp_path / "trace.csv"
    for seed in ("0", "1", "2"):
        r = CliRunner().invoke(cli, ["sim", "gen", str(out), "--jobs", "2000", "--nodes", "100", "--load", "1.2",
                                     "--seed", seed])
        assert r.exit_code == 0 and "offered load 1.20 on 100 nodes" in r.output, r.output
        assert tracegen.offered_load(read_trace(out), 100) == pytest.approx(1.2, rel=1e-3)


def test_cli_plot_to_an_unwritable_path_fails_before_the_replay(tmp_path, cli):
    path = tmp_path / "t.csv"
    path.write_text("0,10,1\n")
    for bad in (tmp_path / "no" / "such" / "p.png", tmp_path / "t.csv" / "p.png"):
        r = CliRunner().invoke(cli, ["sim", str(path), "--nodes", "1", "--plot", str(bad)])
        assert r.exit_code == 1 and f"cannot write the plot to {bad}" in r.output, r.output
        assert "policy" not in r.output and len(r.output.strip().splitlines()) == 1  # nothing was replayed
    fine = tmp_path / "p.png"
    r = CliRunner().invoke(cli, ["sim", str(path), "--nodes", "1", "--plot", str(fine), "--policy", "fifo"])
    assert r.exit_code in (0, 1) and ("plot written" in r.output or "needs matplotlib" in r.output)


def test_cli_table_defines_its_columns(tmp_path, cli):
    path = tmp_path / "t.csv"
    path.write_text("0,10,1,NORMAL,a\n5,10,1,NORMAL,b\n")
    r = CliRunner().invoke(cli, ["sim", str(path), "--nodes", "1"])
    assert r.exit_code == 0, r.output
    text = " ".join(r.output.split())
    assert "fairness: Jain's index over users of (their jobs' run time / their jobs' JCT)" in text
    assert "util: busy node-time / capacity" in text and "intr/job: interrupts" in text
    helped = " ".join(CliRunner().invoke(cli, ["sim", "run", "--help"]).output.split())
    assert "fairness: Jain's index" in helped


@pytest.mark.parametrize("content, message", [
    (None, "cannot read trace"),
    ("0,10,1\n1,ten,1\n", "line 2"),
    ("0,10,64\n", "needs 64 nodes"),
])
def test_cli_user_mistakes_are_one_line(tmp_path, cli, content, message):
    path = tmp_path / "t.csv"
    if content is not None:
        path.write_text(content)
    r = CliRunner().invoke(cli, ["sim", str(path), "--nodes", "4"])
    assert r.exit_code == 1
    assert message in r.output and "Traceback" not in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_cli_plot_without_matplotlib_says_so(tmp_path, cli, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    path = tmp_path / "t.csv"
    path.write_text("0,10,1\n")
    r = CliRunner().invoke(cli, ["sim", str(path), "--nodes", "1", "--plot", str(tmp_path / "p.png")])
    assert r.exit_code == 1 and "needs matplotlib" in r.output


def test_cli_plot_draws_utilisation_and_queue_per_policy(tmp_path, cli):
    pytest.importorskip("matplotlib")
    path = tmp_path / "t.csv"
    path.write_text("submit_s,duration_s,nodes\n0,600,2\n10,600,2\n20,300,1\n")
    out = tmp_path / "p.png"
    r = CliRunner().invoke(cli, ["sim", str(path), "--nodes", "2", "--plot", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_sim_cli_does_not_import_torch():
    code = ("import sys; from hfai.cli.main import main; "
            "main(['sim', '--help'], standalone_mode=False); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False"


def _replay(trace, n_nodes: int, policy: str, config: SimConfig) -> tuple[list[tuple[float, float, int]], int]:
    s = Simulator(trace, n_nodes, sim.POLICIES[policy], config, name=policy)
    s.run()
    return [(w.first_start, w.end, w.interrupts) for w in s.jobs], s.calls


@pytest.mark.parametrize("policy", ["hfai", "las", "fifo"])
def test_passing_over_quiet_wake_ups_changes_no_outcome(policy):
    """The simulator skips its periodic rounds until the plan's quiet_until after a round that
    changed nothing: every job must start, end and be interrupted exactly as with every round
    held, on traces that exercise slices, service bands, decay and the backfill window."""
    from dataclasses import replace

    from hfai.controller.policy import PolicyConfig

    skipped = held = 0
    cases = [
        (tracegen.generate(400, 12, load=1.3, seed=5), 12, PolicyConfig()),
        (tracegen.generate(300, 16, load=1.1, seed=8, elastic=0.4), 16,
         PolicyConfig(slice_s=600.0, above_normal_s=3600.0, own_backfill_s=1800.0)),
        (tracegen.generate(300, 6, load=0.8, seed=9, max_nodes=4), 6, PolicyConfig(service_bands=(1.0, 3.0))),
        (tracegen.generate(200, 4, load=1.5, seed=5, max_nodes=4), 4,  # here ABOVE_NORMAL's decay matters
         PolicyConfig(slice_s=300.0, above_normal_s=1200.0, own_backfill_s=600.0)),
    ]
    for trace, n_nodes, policy_config in cases:
        config = SimConfig(policy=policy_config)
        fast, fast_calls = _replay(trace, n_nodes, policy, config)
        slow, slow_calls = _replay(trace, n_nodes, policy, replace(config, skip_quiet=False))
        assert fast == slow
        skipped, held = skipped + fast_calls, held + slow_calls
    assert skipped < held  # and it does pass rounds over


def test_las_keeps_running_jobs_queues_as_a_fresh_las_works_them_out():
    """The LAS baseline keeps each running job's queue until its service crosses the next
    threshold; a LAS built afresh for every round (nothing kept) must replay alike."""
    from hfai.sim.baselines import make_las

    fresh = FunctionPolicy("las", lambda jobs, nodes, now, config: make_las().decide(jobs, nodes, now, config),
                           sim.LAS.ordering, lambda jobs, now, config: make_las().quiet_until(jobs, now, config))
    trace = tracegen.generate(400, 12, load=1.3, seed=5)
    kept = Simulator(trace, 12, sim.LAS, SimConfig(), name="las")
    kept.run()
    anew = Simulator(trace, 12, fresh, SimConfig(), name="las")
    anew.run()
    assert [(w.first_start, w.end, w.interrupts) for w in kept.jobs] == \
        [(w.first_start, w.end, w.interrupts) for w in anew.jobs]
    assert sum(w.interrupts for w in kept.jobs) > 0  # queues did change under running jobs
