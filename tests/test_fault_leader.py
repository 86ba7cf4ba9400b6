"""Live faults of the leader (issue 11), on real clusters: a leader frozen past its lease
(SIGSTOP) and resumed (SIGCONT) must hand over and then take over again when its turn comes,
never wedge holding the lease; a forged event must not finish someone else's job.

While a controller is frozen, half of the API requests would go to it (queue group), so these
tests read job records and the lease straight from the buckets with a controller's credentials.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
import uuid

import nats.errors
import pytest
from spine_cluster import JOBS, Cluster

from hfai.auth.roles import Role
from hfai.core import nats as _nats
from hfai.protocol import decode, encode, names
from hfai.protocol.types import ChainState, JobRecord, RunEvent, RunEventKind

STEPS = str(JOBS / "steps.py")
TTL_S = 2.0


def _kv_job(c: Cluster, job_id: str) -> JobRecord:
    async def go():
        nc = await _nats.connect(c.config, "test-faults", reconnect=False, creds=str(c.service_creds()))
        try:
            kv = await nc.jetstream().key_value(names.BUCKET_JOBS)
            return decode((await kv.get(job_id)).value, JobRecord)
        finally:
            await nc.close()

    return asyncio.run(go())


def _run_headers(log: str) -> int:
    return len(re.findall(r"^=== hfai: job .* run \d+", log, re.M))


def _controller_log(c: Cluster, name: str) -> str:
    return (c.local.root / "logs" / f"{name}.log").read_text(errors="replace")


def _signal(c: Cluster, name: str, sig: int) -> None:
    # Not LocalCluster.kill: it waits for the process to exit, and a stopped one never does.
    os.kill(c.local.pids[name], sig)


@pytest.mark.slow
def test_leader_frozen_past_its_lease_hands_over_and_leads_again_when_its_turn_comes(tmp_path):
    """Freeze the leader, check the standby schedules a waiting job promptly, thaw the old one;
    then freeze the new leader, so the thawed one must lead again — the wedge of issue 11 left
    it holding the lease without scheduling. Four freezes alternate between the controllers."""
    with Cluster(tmp_path, nodes=2, controllers=2, lease_ttl_s=TTL_S) as c:
        # Holds one node through every failover: it must never be started twice.
        long = c.submit(["python", STEPS, "600", "0.1"], name="long", workdir=tmp_path)
        c.wait_state(long.id, ChainState.RUNNING)
        short = []
        for cycle in range(4):
            old = c.wait(c.leader, 10, "a leader")
            blocker = c.submit(["python", STEPS, "1", "1.0"], name=f"blocker{cycle}", workdir=tmp_path)
            c.wait_state(blocker.id, ChainState.RUNNING)
            queued = c.submit(["python", STEPS, "1", "0.05"], name=f"queued{cycle}", workdir=tmp_path)
            short += [blocker, queued]
            stepped_down = _controller_log(c, old).count("no longer leading")
            # The blocker exits while the leader is frozen; only the next leader can start `queued`.
            _signal(c, old, signal.SIGSTOP)
            t_stop = time.monotonic()
            try:
                new = c.wait(lambda old=old: (h := c.leader()) not in (None, old) and h, 3 * TTL_S,
                             "a standby to take over", 0.05)
                t_new = time.monotonic()
                assert t_new - t_stop <= TTL_S + 1.5, f"takeover took {t_new - t_stop:.1f}s"
                c.wait(lambda queued=queued: _kv_job(c, queued.id).state is not ChainState.QUEUED, TTL_S + 3.0,
                       f"{new} to start the waiting job (cycle {cycle})", 0.1)
            finally:
                _signal(c, old, signal.SIGCONT)
            # The thawed controller notices it lost the lease and stops leading, cleanly.
            c.wait(lambda old=old, n=stepped_down: _controller_log(c, old).count("no longer leading") > n, 10,
                   f"{old} to stop leading")

        for job in short:
            done = c.wait_state(job.id, ChainState.SUCCEEDED, timeout=30)
            assert done.run_id == 1 and _run_headers(c.log(job.id)) == 1, done
        still = c.job(long.id)
        assert still.state is ChainState.RUNNING and still.run_id == 1
        assert _run_headers(c.log(long.id)) == 1
        for name in ("controller-0", "controller-1"):
            text = _controller_log(c, name)
            elected = set(re.findall(r"is leader \(fencing token (\d+)\)", text))
            led = set(re.findall(r"leading with fence (\d+)", text))
            assert elected and elected <= led, f"{name} held the lease without leading: {elected - led}"
        assert all(c.local.alive()[n] for n in ("controller-0", "controller-1"))


@pytest.mark.slow
def test_a_forged_exit_event_does_not_finish_someone_elses_job(tmp_path):
    with Cluster(tmp_path, nodes=2) as c:
        job = c.submit(["python", STEPS, "600", "0.1"], name="bobs-training", user="bob", workdir=tmp_path)
        running = c.wait_state(job.id, ChainState.RUNNING)
        victim = running.nodes[0]
        mallory = next(c.local.node_name(i) for i in range(2) if c.local.node_name(i) != victim)

        def forged(node: str) -> bytes:
            return encode(RunEvent(event=RunEventKind.EXITED, node=node, job_id=job.id, run_id=running.run_id,
                                   ts=time.time(), exit_code=0))

        async def attack():
            # The attacker holds mallory's agent credentials: it may publish on mallory's subject only.
            creds = str(c.local.service_creds(mallory, Role.AGENT))
            nc = await _nats.connect(c.config, "mallory", reconnect=False, creds=creds)
            try:
                js = nc.jetstream()
                for node in (victim, mallory):  # bob's node's name, then its own
                    await js.publish(names.event_subject(mallory), forged(node),
                                     headers={"Nats-Msg-Id": uuid.uuid4().hex})
                with pytest.raises((nats.errors.Error, asyncio.TimeoutError)):  # NATS permissions
                    await js.publish(names.event_subject(victim), forged(victim), timeout=1.0,
                                     headers={"Nats-Msg-Id": uuid.uuid4().hex})
            finally:
                await nc.close()

        asyncio.run(attack())
        c.wait(lambda: _controller_log(c, "controller-0").count("dropping exited event") >= 2, 10,
               "the leader to drop both forged events")
        time.sleep(1.0)  # anything else the leader would do with them, it has done by now
        after = c.job(job.id)
        assert after.state is ChainState.RUNNING and after.exits == {}, after
        c.run(lambda api: api.stop(job.id), user="bob")
        assert c.wait_state(job.id, ChainState.STOPPED, timeout=30).state is ChainState.STOPPED
