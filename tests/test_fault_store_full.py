"""The NATS store's disk full (issue 26 §7): the controllers' probe sees JetStream refuse writes
and says so (`hfai nodes`, the metrics), and on a supervised local cluster nats-server is
restarted once the disk has room, after which the cluster recovers: the queued job starts, the
running one's record ends as its run did, a new submission runs. Without the probe nothing notices: with
every daemon alive, submits time out and queued jobs never start until someone restarts
nats-server by hand.

The store lives on a small tmpfs (this test mounts one: root only) filled by a file it deletes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from spine_cluster import JOBS, Cluster

from hfai.cli import render
from hfai.cli.local import LocalCluster
from hfai.cli.local.supervision import SupervisePolicy
from hfai.controller.metrics import ControllerMetrics
from hfai.controller.store_health import StoreWatch
from hfai.protocol.types import ChainState, StoreHealth

STEPS = str(JOBS / "steps.py")


def test_the_watch_alarms_after_a_run_of_failures_and_clears_at_the_first_success():
    w = StoreWatch(failures_to_alarm=3)
    assert w.writable and not w.observe(True, 10.0)
    assert not w.observe(False, 11.0, "no answer") and not w.observe(False, 12.0, "no answer")
    assert w.writable  # two failures: maybe a busy server
    assert w.observe(False, 13.0, "no answer within 1s") and not w.writable
    h = w.health
    assert (h.writable, h.since, h.failures, h.detail, h.checked) == (False, 11.0, 3, "no answer within 1s", 13.0)
    assert w.observe(True, 14.0) and w.writable and w.health.since == 14.0 and w.health.detail == ""


def test_nodes_line_and_metrics_say_the_store_refuses_writes():
    bad = StoreHealth(writable=False, since=100.0, failures=4, detail="a write got no answer\x1b[2J", checked=160.0)
    line = render.store_line(bad, 220.0)
    assert line is not None and "REFUSING WRITES for 2m" in line and "4 probe writes failed" in line
    assert "\x1b" not in line  # the detail comes from the server: cleaned like any remote text
    assert render.store_line(StoreHealth(), 220.0) is None and render.store_line(None, 220.0) is None
    health = [bad]
    m = ControllerMetrics(lambda: [], lambda: [], lambda: 0, store=lambda: health[0])
    assert m.registry.get_sample_value("hfai_nats_store_writable") == 0
    assert m.registry.get_sample_value("hfai_nats_store_probe_failures") == 4
    health[0] = StoreHealth(checked=230.0)
    assert m.registry.get_sample_value("hfai_nats_store_writable") == 1


def _fill(path: Path) -> None:
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass


@pytest.fixture
def small_store(tmp_path):
    """``tmp_path/nats`` (the local cluster's store) on a 48 MiB tmpfs."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    store = tmp_path / "nats"
    store.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(store)], check=True)
    try:
        yield store
    finally:
        subprocess.run(["umount", "-l", str(store)], check=False)


@pytest.mark.slow
def test_a_full_nats_store_is_reported_then_the_server_restarted_and_the_cluster_recovers(tmp_path, small_store):
    probe = dict(store_probe_s=0.5, store_probe_timeout_s=1.0, store_probe_failures=2)
    c = Cluster(tmp_path, nodes=1, **probe)
    c.local.supervise = SupervisePolicy(tick_s=0.2, first_delay_s=0.5, store_free_bytes=8 << 20, **probe)
    py = sys.executable
    with c:
        running = c.submit([py, STEPS, "30", "0.2"], "running")
        c.wait_state(running.id, ChainState.RUNNING, 30)
        queued = c.submit([py, STEPS, "2", "0.1"], "queued")  # waits for the one node
        _fill(small_store / "filler")

        def refusing():
            _nodes, health = c.run(lambda api: api.nodes_and_store())
            return health if health is not None and not health.writable else None

        health = c.wait(refusing, 30, "the controller to see the store refuse writes")
        assert health.failures >= 2 and "hfai_health" in health.detail
        out = c.cli("nodes")
        assert out.returncode == 0 and "NATS store: REFUSING WRITES" in out.stdout, out.stdout + out.stderr
        c.wait(lambda: any("NATS store refuses writes" in line
                           for line in LocalCluster.load(tmp_path).status_lines()), 30, "the supervisor to see it")
        (small_store / "filler").unlink()

        # The supervisor restarts nats-server; the probe, the queue and the records recover.
        c.wait(lambda: c.run(lambda api: api.nodes_and_store())[1].writable, 60, "the store to take writes")
        for job in (running, queued):
            c.wait_state(job.id, ChainState.SUCCEEDED, 90)
        after = c.submit([py, STEPS, "1", "0.1"], "after")
        c.wait_state(after.id, ChainState.SUCCEEDED, 30)
        status = "\n".join(LocalCluster.load(tmp_path).status_lines())
        assert "nats             running, restarted 1x" in status, status
        log = (tmp_path / "logs" / "supervisor.log").read_text()
        assert "restarting nats-server" in log
        assert "NATS store refuses writes" not in status
