"""The fluid bounds bench/bench_elastic.py reads the policies' figures against (sim/oracle.py)."""

from __future__ import annotations

import pytest

from hfai.sim import TraceJob
from hfai.sim.oracle import fluid_avg_jct, fluid_jct


def job(submit: float, duration: float, lo: int = 1, hi: int = 0, speedup: tuple[float, ...] = ()) -> TraceJob:
    return TraceJob(submit_s=submit, duration_s=duration, nodes=lo, max_nodes=hi, speedup=speedup)


def test_a_job_alone_runs_at_its_best_size_for_its_duration():
    assert fluid_jct([job(10.0, 600.0, 1, 4, (1.0, 1.9, 2.6, 3.0))], 4) == [pytest.approx(600.0)]
    # A size past the curve's best is never taken: more nodes would add nothing.
    assert fluid_jct([job(0.0, 600.0, 1, 4, (1.0, 2.0, 2.0, 2.0))], 8) == [pytest.approx(600.0)]


def test_the_clairvoyant_one_runs_the_shortest_first_and_the_blind_one_by_service_bands():
    trace = [job(0.0, 300.0), job(0.0, 100.0)]  # one node, two rigid jobs arriving together
    assert fluid_jct(trace, 1) == [pytest.approx(400.0), pytest.approx(100.0)]
    # Blind: FIFO within a service band (both in the first: less than a node-hour done).
    assert fluid_jct(trace, 1, clairvoyant=False) == [pytest.approx(300.0), pytest.approx(400.0)]
    assert fluid_avg_jct(trace, 1) < fluid_avg_jct(trace, 1, clairvoyant=False)
    # A job past its first node-hour yields to one that has done less (LAS, not slices).
    trace = [job(0.0, 5000.0), job(4000.0, 100.0)]
    assert fluid_jct(trace, 1, clairvoyant=False) == [pytest.approx(5100.0), pytest.approx(100.0)]


def test_nodes_go_where_they_add_most():
    flat = job(0.0, 1000.0, 1, 4, (1.0, 1.05, 1.1, 1.1))
    linear = job(0.0, 1000.0, 1, 4, (1.0, 2.0, 3.0, 4.0))
    # 4 nodes: the flat job keeps one (its second adds 5%), the linear one gets three; once the
    # flat one's 1100 node-seconds are done, the linear one has all four for its last 700.
    for clairvoyant in (True, False):
        jct = fluid_jct([flat, linear], 4, clairvoyant)
        assert jct == [pytest.approx(1100.0), pytest.approx(1100.0 + 700.0 / 4)]
