"""Operators' controls on a live cluster: quotas (live changes), AUTO priority, drain, elastic jobs,
retention of finished jobs."""

from __future__ import annotations

import pytest
from spine_cluster import JOBS, Cluster

from hfai.protocol.errors import Forbidden, NotFound
from hfai.protocol.types import ChainState, Priority

# Starts real clusters (nats-server, controllers, agents): excluded by `pytest -m "not slow"`.
pytestmark = pytest.mark.slow

STEPS = str(JOBS / "steps.py")
SCALING = str(JOBS / "scaling_steps.py")
N = Priority.NORMAL


def test_quota_makes_jobs_wait_and_a_change_takes_effect_live(tmp_path):
    with Cluster(tmp_path, nodes=2) as c:
        with pytest.raises(Forbidden, match="only operators"):
            c.run(lambda api: api.set_quota("alice", N, "*", 1), user="alice")
        c.run(lambda api: api.set_quota("alice", N, "*", 1), user="root")
        first = c.submit(["python", STEPS, "100", "0.1"], name="a1", user="alice", workdir=tmp_path)
        second = c.submit(["python", STEPS, "100", "0.1"], name="a2", user="alice", workdir=tmp_path)
        c.wait_state(first.id, ChainState.RUNNING)
        waiting = c.wait(lambda: "quota" in (j := c.job(second.id)).reason and j, 10, "a quota wait reason")
        assert waiting.state is ChainState.QUEUED
        ls = c.cli("quota", "ls")
        assert "alice" in ls.stdout and "NORMAL" in ls.stdout
        c.run(lambda api: api.set_quota("alice", N, "*", 2), user="root")
        c.wait_state(second.id, ChainState.RUNNING, timeout=10)


def test_auto_priority_picks_the_highest_level_with_quota_room(tmp_path):
    with Cluster(tmp_path, nodes=2) as c:
        c.run(lambda api: api.set_quota("bob", Priority.HIGH, "*", 1), user="root")
        first = c.submit(["python", STEPS, "100", "0.1"], name="b1", user="bob", priority=-1, workdir=tmp_path)
        assert first.spec.priority == Priority.HIGH
        c.wait_state(first.id, ChainState.RUNNING)
        r = c.cli("submit", "-p", "AUTO", "--name", "b2", "python", STEPS, "1", "0")
        assert r.returncode == 0 and "priority NORMAL" in r.stdout  # tester has no quota: the fallback


def test_drained_node_gets_no_work_until_undrained(tmp_path):
    with Cluster(tmp_path, nodes=2) as c:
        assert c.cli("node", "drain", "node-1", "--reason", "bad fan").returncode != 0  # tester is no operator
        c.run(lambda api: api.drain("node-1", True, "bad fan"), user="root")
        big = c.submit(["python", STEPS, "1", "0"], name="big", nodes=2, workdir=tmp_path)
        small = c.submit(["python", STEPS, "1", "0"], name="small", workdir=tmp_path)
        assert c.wait_state(small.id, ChainState.SUCCEEDED).nodes == ("node-0",)
        assert c.job(big.id).state is ChainState.QUEUED
        nodes = c.cli("nodes").stdout
        assert any(line.split()[:3] == ["node-1", "default", "drained"] for line in nodes.splitlines())
        c.run(lambda api: api.drain("node-1", False), user="root")
        assert c.wait_state(big.id, ChainState.SUCCEEDED).nodes == ("node-0", "node-1")


def test_elastic_job_grows_into_idle_nodes_and_shrinks_when_others_wait(tmp_path):
    with Cluster(tmp_path, nodes=2, slice_s=1.0) as c:
        # A job that scales (its steps/s double on two nodes): the default policy grows a job only
        # by the gain it measured or expects, and a flat one is rightly left on one node.
        r = c.cli("submit", "-n", "1:2", "--name", "elastic", "python", SCALING, "300", "0.1", "1", cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        elastic = c.job("elastic")
        assert (elastic.spec.min_nodes, elastic.spec.max_nodes) == (1, 2)
        running = c.wait_state(elastic.id, ChainState.RUNNING)
        assert len(running.nodes) == 2
        other = c.submit(["python", STEPS, "20", "0.1"], name="other", user="olga", workdir=tmp_path)
        c.wait_state(other.id, ChainState.RUNNING, timeout=30)
        shrunk = c.wait(lambda: (j := c.job(elastic.id)).state is ChainState.RUNNING and len(j.nodes) == 1 and j,
                        30, "the elastic job to restart on one node")
        assert shrunk.run_id >= 2 and shrunk.suspend_count >= 1
        c.wait(lambda: "of 1 starts at step" in c.log(elastic.id), 30, "a run with WORLD_SIZE=1")
        c.wait_state(other.id, ChainState.SUCCEEDED, timeout=60)
        grown = c.wait(lambda: (j := c.job(elastic.id)).state is ChainState.RUNNING and len(j.nodes) == 2 and j,
                       60, "the elastic job to grow back into the idle node")
        assert grown.run_id > shrunk.run_id
        c.run(lambda api: api.stop(elastic.id))


def test_finished_jobs_are_forgotten_after_the_retention(tmp_path):
    with Cluster(tmp_path, nodes=1, finished_retention_s=1.0, gc_interval_s=0.2) as c:
        short = c.submit(["python", STEPS, "1", "0.1"], name="short", workdir=tmp_path)
        c.wait_state(short.id, ChainState.SUCCEEDED)
        assert any(j.id == short.id for j in c.run(lambda api: api.list(include_finished=True)))
        long = c.submit(["python", STEPS, "100", "0.1"], name="long", workdir=tmp_path)
        c.wait_state(long.id, ChainState.RUNNING)

        def forgotten():
            try:
                c.job(short.id)
            except NotFound:
                return True
            return False

        c.wait(forgotten, 20, "the finished job's record to be dropped")
        listed = {j.id for j in c.run(lambda api: api.list(include_finished=True))}
        assert short.id not in listed and long.id in listed  # a live job is never dropped
        assert c.job(long.id).state is ChainState.RUNNING


def test_list_and_nodes_replies_are_paged(tmp_path):
    # A reply budget far below one page of records forces many pages, as thousands of jobs or
    # nodes would against NATS's 1 MiB message limit.
    with Cluster(tmp_path, nodes=3, api_reply_bytes=1500) as c:
        ids = [c.submit(["python", STEPS, "100", "0.1"], name=f"p{i}", workdir=tmp_path).id for i in range(7)]
        listed = c.run(lambda api: api.list())
        assert [j.id for j in listed] == ids  # all of them, once each, in submission order
        nodes = c.run(lambda api: api.nodes())
        assert [n.record.name for n in nodes] == ["node-0", "node-1", "node-2"]
        ps = c.cli("ps")
        assert ps.returncode == 0 and all(i in ps.stdout for i in ids), ps.stdout

        async def one_page(api):
            from hfai.protocol import verbs
            from hfai.protocol.types import ListRequest

            return await api.call(verbs.LIST, ListRequest())

        page = c.run(one_page)
        assert page.more and 0 < len(page.jobs) < len(ids)
