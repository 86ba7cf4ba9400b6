"""GPU health on a live cluster (issue 35 part 2): an injected hardware Xid drains its node and
the checkpointing job there resumes on the other node from its checkpoint, not failed; an
application Xid is recorded on the job (`hfai status` shows it among its history) and leaves its
node in service; a node a fault
drained comes back only after a passing check, or forced. Prints how long detection took."""

from __future__ import annotations

import dataclasses
import re
import time

import pytest
from spine_cluster import JOBS, Cluster

from hfai.protocol.reasons import ReasonCode
from hfai.protocol.types import ChainState, NodeState

# Starts real clusters (nats-server, controllers, agents): excluded by `pytest -m "not slow"`.
pytestmark = pytest.mark.slow

STEPS = str(JOBS / "steps.py")
HEALTH_INTERVAL_S = 1.0


def _node(c: Cluster, name: str):
    return next(n for n in c.run(lambda api: api.nodes()) if n.record.name == name)


def _drained_by_fault(c: Cluster, name: str, words: str):
    n = _node(c, name)
    return n if n.state is NodeState.DRAINED and words in n.reason else None


def test_hardware_xid_drains_the_node_and_the_job_resumes_elsewhere(tmp_path):
    cluster = Cluster(tmp_path, nodes=2)
    cluster.local.agent = dataclasses.replace(cluster.local.agent, health_interval_s=HEALTH_INTERVAL_S)
    with cluster as c:
        job = c.submit(["python", STEPS, "400", "0.05"], name="ckpt", workdir=tmp_path)
        running = c.wait_state(job.id, ChainState.RUNNING, timeout=60)
        bad = running.nodes[0]
        good = next(n for n in ("node-0", "node-1") if n != bad)
        c.wait(lambda: "starts at step 0" in c.log(job.id), 30, "the job's first run to start")
        time.sleep(1.0)  # some steps done before the fault

        assert c.cli("admin", "fault", bad, "--xid", "79", "--gpu", "3").returncode != 0  # tester is no operator
        began = time.monotonic()
        r = c.cli("admin", "fault", bad, "--xid", "79", "--gpu", "3", user="root")
        assert r.returncode == 0, r.stderr
        drained = c.wait(lambda: _drained_by_fault(c, bad, "Xid 79 on GPU 3: fell off the bus"), 30,
                         f"{bad} drained by the fault", poll=0.05)
        detected = time.monotonic() - began
        print(f"\ndetection (hardware Xid 79, inject -> node drained): {detected:.2f} s "
              f"(health interval {HEALTH_INTERVAL_S:g} s)")
        assert drained.record.fault is not None and drained.record.fault.hardware

        resumed = c.wait(lambda: (j := c.job(job.id)).state is ChainState.RUNNING and j.run_id == 2 and j, 60,
                         "the job to resume on the other node")
        assert resumed.nodes == (good,)
        interrupted = [e for e in resumed.history if e.why is not None and e.why.code == ReasonCode.GPU_ERROR]
        assert interrupted and "Xid 79 on GPU 3: fell off the bus" in interrupted[0].reason
        assert any(e.why is not None and e.why.code == ReasonCode.GPU_FAULT and "Xid 79" in e.reason
                   for e in resumed.faults)

        # An application Xid on the node the job now runs on: in its history, the node in service.
        r = c.cli("admin", "fault", good, "--xid", "13", "--gpu", "0", user="root")
        assert r.returncode == 0, r.stderr
        c.wait(lambda: any("Xid 13 on GPU 0 of " + good in e.reason for e in c.job(job.id).faults), 30,
               "the application Xid on the job")
        status = c.cli("status", job.id).stdout
        assert f"Xid 13 on GPU 0 of {good}" in status and "(the job's own error: the node stays in service)" in status
        assert _node(c, good).state is NodeState.UP
        assert c.job(job.id).state is ChainState.RUNNING

        done = c.wait_state(job.id, ChainState.SUCCEEDED, timeout=120)
        assert done.suspend_count == 1 and done.retried == 0
        # Each node keeps the log of the run it ran.
        stopped_at = int(re.search(r"suspending at step (\d+)", c.log(job.id, node=bad)).group(1))
        resumed_at = int(re.search(r"run 2 rank 0 of 1 starts at step (\d+)", c.log(job.id, node=good)).group(1))
        assert stopped_at > 0 and resumed_at == stopped_at  # no step before the checkpoint again

        # Back in service only after a passing check, or forced.
        r = c.cli("node", "undrain", bad, user="root")
        assert r.returncode != 0 and "--force" in r.stderr
        assert c.cli("admin", "validate", bad, user="root").returncode == 1  # its GPU 3 is still broken
        assert c.cli("admin", "fault", bad, "--clear", user="root").returncode == 0
        r = c.cli("admin", "validate", bad, user="root")
        assert r.returncode == 0 and "passed" in r.stdout, r.stdout + r.stderr
        c.wait(lambda: _node(c, bad).state is NodeState.UP, 10, f"{bad} back in service")


# Each polled signal and an application Xid, as `hfai admin fault` injects them: (flag, value,
# words of its meaning, whether it drains the node).
SIGNALS = [
    ("--signal", "thermal", "clocks throttled: too hot", False),
    ("--signal", "power", "clocks throttled: power brake or cap", False),
    ("--xid", "13", "Xid 13 on GPU 0", False),
    ("--signal", "dbe", "uncorrectable ECC errors", True),
    ("--signal", "retired", "retired memory pages pending", True),
    ("--signal", "lost", "GPU is lost", True),
]


def _with_fault(c: Cluster, name: str, words: str):
    n = _node(c, name)
    return n if any(words in f.text() for f in n.record.faults) else None


def test_every_injected_signal_is_recorded_on_its_node_and_classified(tmp_path):
    """Each kind of fault reaches the node's record (`hfai nodes`) with its meaning; a hardware one
    drains the node, a warning or the job's own error does not. Prints each one's detection time
    (inject -> shown), which the health interval bounds (docs/health.md)."""
    cluster = Cluster(tmp_path, nodes=1)
    cluster.local.agent = dataclasses.replace(cluster.local.agent, health_interval_s=HEALTH_INTERVAL_S)
    times = []
    with cluster as c:
        c.wait(lambda: _node(c, "node-0").state is NodeState.UP, 30, "node-0 up")
        for flag, value, words, drains in SIGNALS:
            began = time.monotonic()
            r = c.cli("admin", "fault", "node-0", flag, value, "--gpu", "0", user="root")
            assert r.returncode == 0, r.stderr
            node = c.wait(lambda w=words: _with_fault(c, "node-0", w), 30, f"{value} on node-0's record", poll=0.05)
            times.append((value, time.monotonic() - began))
            fault = next(f for f in node.record.faults if words in f.text())
            assert fault.hardware is drains, (value, fault)
            if not drains:
                assert node.state is NodeState.UP, (value, node.reason)
            else:
                c.wait(lambda: _node(c, "node-0").state is NodeState.DRAINED, 30, f"node-0 drained by {value}")
    print("\ndetection (inject -> on the node's record), health interval "
          f"{HEALTH_INTERVAL_S:g} s: " + ", ".join(f"{v} {s:.2f} s" for v, s in times))
