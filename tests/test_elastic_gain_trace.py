"""Traces with speedup curves: Pollux's artifact converted (bench/pollux_trace.py) on a tiny
artifact written here, the checked-in derived trace, and the gain policy's replays."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from hfai.controller.policy import PolicyConfig
from hfai.sim import POLICIES, SimConfig, Simulator, read_trace

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def pollux_trace():
    spec = importlib.util.spec_from_file_location("pollux_trace", BENCH / "pollux_trace.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pollux_trace"] = module
    spec.loader.exec_module(module)
    return module


def _artifact(root: Path) -> Path:
    """A checkout with one model: 2 s a step at 1 node, 1.25 s at 2 (per-GPU batch 16 and 8),
    and at 3 nodes slower again; 100 iterations to finish at batch 64."""
    model = root / "simulator" / "traces" / "toy"
    model.mkdir(parents=True)
    (model / "placements.csv").write_text(
        "placement,local_bsz,step_time,sync_time\n"
        "4,8,1.5,0.1\n4,16,2.0,0.1\n44,8,1.25,0.3\n44,16,1.6,0.3\n444,8,1.6,0.8\n444,16,2.0,0.8\n")
    (model / "scalability.csv").write_text("num_nodes,num_replicas,local_bsz,step_time,sync_time\n")
    (model / "validation-64.csv").write_text(
        "progress,iteration,metric,grad_sqr,grad_var\n1,50,0.5,1,1\n2,100,0.6,1,1\n")
    bench = root / "benchmark" / "workloads"
    bench.mkdir(parents=True)
    (bench / "w.csv").write_text("name,time,application,num_replicas,batch_size\ntoy-0,30,toy,12,64\n")
    return root


def test_the_converter_keeps_the_measured_curve_up_to_its_peak(pollux_trace, tmp_path, monkeypatch):
    monkeypatch.setitem(pollux_trace.MODELS, "toy", (2, None))
    elastic, rigid = pollux_trace.convert(pollux_trace.Artifact(_artifact(tmp_path)), "workloads/w")
    # Batch 64: 16 a GPU on 1 node (2.0 s), 8 on 2 (1.25 s: 1.6x), on 3 below the smallest
    # measured (6 < 8): not used. 100 iterations at 2.0 s on one node: 200 s, 125 s on 2.
    (e,), (r,) = elastic, rigid
    assert (e.nodes, e.max_nodes, e.user, e.submit_s) == (1, 2, "toy-0", 30.0)
    assert e.speedup == pytest.approx((1.0, 1.6))
    assert e.duration_s == pytest.approx(125.0) and e.work == pytest.approx(200.0)
    # The workload asked for 12 GPUs (3 nodes): rigid at most at the curve's peak, the same work.
    assert (r.nodes, r.max_nodes) == (2, 0) and r.work == pytest.approx(200.0)


def test_the_checked_in_pollux_trace_reads_and_names_its_source():
    path = BENCH / "traces" / "pollux-workload-1-elastic.csv"
    assert "petuum/adaptdl" in path.read_text().splitlines()[0]
    jobs = read_trace(path)
    assert len(jobs) == 160 and sum(1 for j in jobs if j.speedup and j.max_nodes) > 80
    rigid = read_trace(BENCH / "traces" / "pollux-workload-1-rigid.csv")
    assert [j.work for j in jobs] == pytest.approx([j.work for j in rigid], rel=1e-5)


def test_passing_over_quiet_wake_ups_changes_no_outcome_of_the_gain_policy():
    """The gain policy shares hfai's quiet_until: its resizes wait for a slice held, which that
    counts, so skipping the rounds before it changes no start, end or interruption."""
    trace = read_trace(BENCH / "traces" / "pollux-workload-1-elastic.csv")[:60]
    for config in (SimConfig(), SimConfig(policy=PolicyConfig(slice_s=600.0, prior_serial=0.05))):
        runs = []
        for cfg in (config, replace(config, skip_quiet=False)):
            s = Simulator(trace, 16, POLICIES["hfai-gain"], cfg, name="hfai-gain")
            s.run()
            runs.append([(w.first_start, w.end, w.interrupts) for w in s.jobs])
        assert runs[0] == runs[1]
