"""Elastic jobs sized by what they gain, on a live local cluster: a job's steps are counted with no
change to its code, relayed by its agent, kept in its record, and the leader's gain policy moves
nodes to the elastic job whose next node adds the most (docs/scheduling.md, "Elastic jobs")."""

from __future__ import annotations

import dataclasses

import pytest
from spine_cluster import JOBS, TEST_AGENT, Cluster

from hfai.protocol.types import ChainState

# Starts a real cluster (nats-server, a controller, four agents): excluded by `pytest -m "not slow"`.
pytestmark = pytest.mark.slow

SCALING = str(JOBS / "scaling_steps.py")
# Windows of 1 s, relayed every second, slices of 8 s: the whole cycle (measure at one size,
# resize, measure at another) takes seconds instead of the production minutes.
AGENT = dataclasses.replace(TEST_AGENT, throughput_relay_s=1.0)
FAST = {"HFAI_THROUGHPUT_INTERVAL_S": "1"}


def test_the_job_that_scales_ends_up_with_more_nodes_than_the_one_that_does_not(tmp_path):
    """The flat job starts alone on all four nodes and is measured there; the scaling one arrives,
    takes three in a time slice, and is measured there; the flat one, measured on 1 node too, is
    then known to gain nothing from more and is left on 1 when the scaling one has finished."""
    with Cluster(tmp_path, nodes=4, agent=AGENT, slice_s=8.0, resize_cost_s=2.0, policy="hfai-gain") as c:
        # The flat job first: alone, it takes all four idle nodes (nothing measured yet: linear).
        flat = c.submit(["python", SCALING, "500", "0.1", "0"], name="flat", user="alice", workdir=tmp_path,
                        nodes=4, min_nodes=1, max_nodes=4, env=FAST)
        assert len(c.wait_state(flat.id, ChainState.RUNNING).nodes) == 4
        c.wait(lambda: c.job(flat.id).throughput, 30, "the flat job's steps/s measured on 4 nodes")
        scaling = c.submit(["python", SCALING, "300", "0.2", "1"], name="scaling", user="bob", workdir=tmp_path,
                           nodes=4, min_nodes=1, max_nodes=4, env=FAST)

        def scaling_ahead():
            f, s = c.job(flat.id), c.job(scaling.id)
            both = f.state is ChainState.RUNNING and s.state is ChainState.RUNNING
            return (f, s) if both and len(s.nodes) > len(f.nodes) else None

        f, s = c.wait(scaling_ahead, 240, "the scaling job to hold more nodes than the flat one")
        assert {r.nodes for r in f.throughput} >= {4}, f.throughput  # measured where it ran
        assert f.throughput_unit == "steps"
        grew = [e.reason for e in s.history if "steps/s expected" in e.reason]
        shrank = [e.reason for e in f.history if "gives up added" in e.reason]
        assert grew or shrank, (s.history, f.history)
        c.wait(lambda: c.job(scaling.id).throughput, 30, "the scaling job's steps/s measured")
        status = c.cli("status", scaling.id)
        assert status.returncode == 0 and "steps/s" in status.stdout, status.stdout
        c.wait_state(scaling.id, ChainState.SUCCEEDED, timeout=300)
        # The scaling job ends first; the flat one, measured on 4 nodes and on 1 at the same steps/s,
        # is not grown into the nodes it leaves idle (hfai's linear assumption would grow it).
        done = c.wait_state(flat.id, ChainState.SUCCEEDED, timeout=300)
        assert {r.nodes for r in done.throughput} >= {1, 4}, done.throughput
        assert len(done.last_nodes) == 1 and not [e for e in done.history if "grows" in e.reason], done.history
