"""`hfai local up` supervises its daemons (issue 26 §7): one that died is restarted with a backoff
and a bound, `hfai local status` shows the restarts, and `hfai local down` stops everything for
good. The decisions are pure (hfai.cli.local.supervision) and tested on a made-up clock; one live test
kills daemons of a real supervised cluster."""

from __future__ import annotations

import asyncio
import os
import signal
import time
import urllib.request

import pytest
from ports import free_port
from spine_cluster import TEST_AGENT, TEST_CONTROLLER
from waits import wait_for

from hfai._proc import pid_alive
from hfai.cli.local import LocalCluster
from hfai.cli.local.supervision import Step, SupervisePolicy, Track, store_restart_due
from hfai.core.config import WebConfig
from hfai.protocol.errors import Unavailable

POLICY = SupervisePolicy(first_delay_s=1.0, max_delay_s=8.0, burst=3, window_s=100.0, steady_s=20.0)


def test_a_dead_daemon_is_restarted_after_a_doubling_delay_then_given_up_on():
    t = Track(started=0.0)
    assert t.see(True, 1.0, POLICY) is Step.NOTHING
    assert t.see(False, 2.0, POLICY, "killed by SIGKILL") is Step.NOTHING  # found dead: wait 1 s
    assert t.see(False, 2.9, POLICY) is Step.NOTHING
    assert t.see(False, 3.0, POLICY) is Step.RESTART
    t.restarted(3.0)
    assert t.last_exit == "killed by SIGKILL" and t.total == 1
    assert t.see(False, 4.0, POLICY) is Step.NOTHING and t.see(False, 5.9, POLICY) is Step.NOTHING  # now 2 s
    assert t.see(False, 6.0, POLICY) is Step.RESTART
    t.restarted(6.0)
    assert t.see(False, 7.0, POLICY) is Step.NOTHING and t.see(False, 11.0, POLICY) is Step.RESTART  # 4 s
    t.restarted(11.0)
    # The fourth death within the window: given up on, and it stays so.
    assert t.see(False, 12.0, POLICY) is Step.NOTHING
    assert t.see(False, 20.0, POLICY) is Step.GIVE_UP
    assert t.gave_up and t.see(False, 500.0, POLICY) is Step.NOTHING
    assert {k: v for k, v in t.summary().items() if k != "last_exit"} == {"restarts": 3, "last_restart": 11.0,
                                                                          "gave_up": True}


def test_a_daemon_that_stayed_up_starts_its_backoff_over_and_old_restarts_leave_the_window():
    t = Track(started=0.0)
    for now in (10.0, 30.0):
        t.see(False, now, POLICY)
        assert t.see(False, now + t.delay(POLICY), POLICY) is Step.RESTART
        t.restarted(now + t.delay(POLICY))
    assert t.delay(POLICY) == 4.0
    assert t.see(True, t.started + 19.0, POLICY) is Step.NOTHING and t.delay(POLICY) == 4.0
    assert t.see(True, t.started + 20.0, POLICY) is Step.NOTHING and t.delay(POLICY) == 1.0  # steady
    # Two restarts long ago (outside window_s) do not count towards the bound.
    t.see(False, 200.0, POLICY)
    assert t.see(False, 201.0, POLICY) is Step.RESTART
    assert Track(started=0.0, streak=10).delay(POLICY) == POLICY.max_delay_s


def test_the_nats_server_is_restarted_for_its_store_only_when_the_disk_has_room():
    p = SupervisePolicy(store_probe_s=1.0, store_probe_timeout_s=1.0, store_probe_failures=3, first_delay_s=1.0,
                        store_free_bytes=1000)
    assert not store_restart_due(True, 10**9, p, 0.0, 100.0)  # writable: never
    assert not store_restart_due(False, 999, p, 0.0, 100.0)  # still full: a restart would break again
    assert store_restart_due(False, 1000, p, 0.0, 100.0)
    assert store_restart_due(False, None, p, 0.0, 100.0)  # room unknown (a joined server's disk)
    # Right after a restart the new server has not been judged yet (3 probes of up to 2 s, + 1 s).
    assert not store_restart_due(False, 10**9, p, 100.0, 106.9)
    assert store_restart_due(False, 10**9, p, 100.0, 107.0)


def _restarted(local: LocalCluster, name: str, old_pid: int):
    def check():
        loaded = LocalCluster.load(local.root)
        pid = loaded.pids.get(name) if loaded else None
        return loaded if pid and pid != old_pid and pid_alive(pid) else None
    return check


def test_a_supervised_local_cluster_restarts_what_died_and_down_stops_it_for_good(tmp_path):
    policy = SupervisePolicy(tick_s=0.1, first_delay_s=0.2, max_delay_s=1.0, burst=2, window_s=600.0,
                             store_probe_s=0.5)
    local = LocalCluster(root=tmp_path, nodes=1, controller=TEST_CONTROLLER, agent=TEST_AGENT, supervise=policy)
    local.up()
    try:
        local.wait_ready()
        sup = local.supervision["pid"]
        assert pid_alive(sup)
        # An agent and the controller killed -9: both come back, the status says so.
        for name in ("agent-node-0", "controller-0"):
            old = local.pids[name]
            os.kill(old, signal.SIGKILL)
            loaded = wait_for(_restarted(local, name, old), 20.0, f"{name} restarted")
        loaded.wait_ready()
        status = "\n".join(loaded.status_lines())
        assert "agent-node-0     running, restarted 1x" in status, status
        assert "controller-0     running, restarted 1x" in status, status
        assert "supervisor       running" in status
        # The NATS server too, on the same URL: the daemons reconnect and the API answers.
        old = loaded.pids["nats"]
        os.kill(old, signal.SIGKILL)
        loaded = wait_for(_restarted(local, "nats", old), 20.0, "nats restarted")
        assert loaded.url == local.url
        loaded.wait_ready()
        # Bound: the agent's second death within the window is its last restart (burst=2) and
        # the third is given up on.
        old = LocalCluster.load(local.root).pids["agent-node-0"]
        os.kill(old, signal.SIGKILL)
        wait_for(_restarted(local, "agent-node-0", old), 20.0, "agent restarted")
        os.kill(LocalCluster.load(local.root).pids["agent-node-0"], signal.SIGKILL)
        wait_for(lambda: "dead (given up on)" in "\n".join(LocalCluster.load(local.root).status_lines()), 20.0,
              "the agent given up on")
        agent = next(line for line in LocalCluster.load(local.root).status_lines() if "agent-node-0" in line)
        # Its last process was the supervisor's child: how it ended is known.
        assert "restarted 2x" in agent and "how it ended: killed by SIGKILL" in agent, agent
        log = (tmp_path / "logs" / "supervisor.log").read_text()
        assert "restarting agent-node-0" in log and "not restarting it again" in log
    finally:
        local.down()
    # Down: the supervisor first, then every daemon, including those it started; none returns.
    time.sleep(1.0)  # five times the first restart delay
    assert not pid_alive(sup)
    assert not any(pid_alive(p) for p in local.pids.values()), local.pids
    assert not local.is_up() and LocalCluster.load(tmp_path) is None


def test_down_of_an_unsupervised_cluster_stops_a_daemon_restarted_since_it_was_saved(tmp_path):
    """Without a supervisor, cluster.json is not the truth: a daemon restarted by hand (as fault
    tests do) after the last save must still be stopped by down() (it was left running, and so
    were storage services and controllers restarted by tests)."""
    c = LocalCluster(root=tmp_path, nodes=1, controller=TEST_CONTROLLER, agent=TEST_AGENT, supervise=None,
                     web=WebConfig(port=free_port()))
    c.up()
    try:
        c.wait_ready()
        # Ready means hfai-web takes connections (up prints its address) and the storage service
        # serves: a push made right after up() found no one on its subject while it was starting.
        c.kill("web", signal.SIGKILL)
        with pytest.raises(Unavailable, match="did not come up"):
            c.wait_ready(timeout_s=1.0)
        c.start_web()
        c.kill("storage", signal.SIGKILL)
        with pytest.raises(Unavailable, match="did not come up"):
            c.wait_ready(timeout_s=1.0)
        restarted = c.start_storage().pid
        assert c.pids["storage"] == restarted
        c.wait_ready()
        assert asyncio.run(_workspaces(c)) == ()
        with urllib.request.urlopen(f"http://127.0.0.1:{c.web.port}/healthz", timeout=5) as r:
            assert r.status == 200
    finally:
        c.down()
    assert not pid_alive(restarted)


async def _workspaces(c: LocalCluster) -> tuple:
    """The owner's workspaces, asked once (no retry: the service must be serving already)."""
    from hfai.protocol import storage as s
    from hfai.storage.client import StorageClient

    client = StorageClient(c.config(), user=c.owner)
    async with client:
        return (await client.scall(s.WS_LIST, s.ListWorkspaces())).workspaces
