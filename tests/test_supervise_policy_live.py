"""A supervised local cluster whose nats-server is killed (issue 38 §8): the supervisor restarts it
for what happened (it died; killed by SIGKILL once it is the supervisor's own child), never for
"its store refused writes", and raises no CRITICAL store alarm, though the server stays down
long enough for several store probes to fail."""

from __future__ import annotations

import os
import signal

import pytest
from spine_cluster import TEST_AGENT, TEST_CONTROLLER
from waits import wait_for

from hfai._proc import pid_alive
from hfai.cli.local import LocalCluster
from hfai.cli.local.supervision import SupervisePolicy

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

# The server stays down 3 s before each restart, while the store is probed twice a second.
POLICY = SupervisePolicy(tick_s=0.1, first_delay_s=3.0, max_delay_s=3.0, burst=5, window_s=600.0,
                         store_probe_s=0.5, store_probe_timeout_s=0.5, store_probe_failures=3)


def _nats_restarted(root, old_pid: int):
    def check():
        loaded = LocalCluster.load(root)
        pid = loaded.pids.get("nats") if loaded else None
        return loaded if pid and pid != old_pid and pid_alive(pid) else None
    return check


def test_a_killed_nats_server_is_restarted_for_its_death_with_no_store_alarm(tmp_path):
    local = LocalCluster(root=tmp_path, nodes=1, controller=TEST_CONTROLLER, agent=TEST_AGENT, supervise=POLICY)
    local.up()
    try:
        local.wait_ready()
        loaded = local
        for _ in range(2):  # the first was started by `up`; the second by the supervisor, its child
            old = loaded.pids["nats"]
            os.kill(old, signal.SIGKILL)
            loaded = wait_for(_nats_restarted(tmp_path, old), 30.0, "nats-server restarted")
            loaded.wait_ready()
        status = "\n".join(loaded.status_lines())
        log = (tmp_path / "logs" / "supervisor.log").read_text()
    finally:
        local.down()
    assert "restarting nats (restart 1): it ended; how is unknown (not the supervisor's child)" in log, log
    assert "restarting nats (restart 2): killed by SIGKILL" in log, log
    assert "restarted 2x" in status and "how it ended: killed by SIGKILL" in status, status
    assert "store refused writes" not in log and "CRITICAL" not in log, log
