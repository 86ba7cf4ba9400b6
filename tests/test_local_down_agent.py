"""`hfai local down` interrupts the jobs through the agents (hfai.agent.operations), not a second
executor: the agent suspends its runs with its own plan (the job checkpoints on its flag), the
record shows an interruption by the platform, and `hfai local up` resumes the job from its
checkpoint. Only operators may ask an agent to suspend its node."""

from __future__ import annotations

import asyncio

import pytest
from test_spine_local_restart import STEPS, hfai, job, job_id, ok, wait_state
from waits import wait_for

from hfai.api.client import ApiClient
from hfai.api.config import current_user
from hfai.cli.local import LocalCluster
from hfai.cli.local.interrupt import suspend
from hfai.protocol.errors import Forbidden
from hfai.protocol.types import ChainState, NodeSuspendRequest


@pytest.mark.slow
def test_down_has_the_agent_suspend_the_job_and_up_resumes_it(home, tmp_path):
    ok(hfai(home, "local", "up", "--nodes", "1"))
    jid = job_id(ok(hfai(home, "submit", "--name", "steps", "python", STEPS, "6000", "0.1", cwd=tmp_path)))
    log = home / "local/agents/node-0/logs" / jid / "rank0.log"
    wait_for(lambda: log.exists() and "starts at step 0" in log.read_text(), 60, "the job to start")

    local = LocalCluster.load(home / "local")
    assert local is not None
    local.user_creds("bob")  # a user, not an operator

    async def as_bob() -> None:
        async with ApiClient(local.config(), user="bob") as ops:
            await suspend(ops, "node-0", NodeSuspendRequest(ack_window_s=0.0, kill_window_s=0.0))

    with pytest.raises(Forbidden, match="only operators"):
        asyncio.run(as_bob())
    assert job(home, jid).state is ChainState.RUNNING and "suspending" not in log.read_text()

    down = ok(hfai(home, "local", "down"))
    assert "interrupting 1 running job rank(s)" in down and "(1 job rank(s) interrupted)" in down
    agent = (home / "local/logs/agent-node-0.log").read_text()
    assert f"operator {current_user()} suspends every run on this node" in agent
    assert f"asking {jid}.1 to suspend" in agent  # the agent's own interrupt, as for the leader's suspend
    assert "suspending at step" in log.read_text() and (tmp_path / f"steps_{jid}_0.txt").exists()

    ok(hfai(home, "local", "up", "--nodes", "1"))
    resumed = wait_state(home, jid, ChainState.RUNNING, run=2)
    assert resumed.run_id == 2 and resumed.suspend_count == 1
    assert "failed" not in [h.state.value for h in resumed.history]
    assert "stopped by the platform" in ok(hfai(home, "status", jid))
    wait_for(lambda: "run 2 rank 0 of 1 starts at step" in log.read_text(), 30, "the job to resume")
    assert "starts at step 0" not in log.read_text().split("run 2 rank 0")[1]  # from its checkpoint
    ok(hfai(home, "local", "down", "--now"))


def test_an_agent_that_does_not_answer_is_reported_silent(tmp_path):
    """No agent serves node-0: `down` learns it at once (no responders) and falls back to
    stopping that node's jobs itself."""
    from hfai.cli.local.interrupt import suspend_nodes
    from hfai.cli.local.nats_server import start_nats
    from hfai.core.config import Config, NatsConfig

    server, url = start_nats(tmp_path / "nats", tmp_path / "nats.log")
    try:
        config = Config(nats=NatsConfig(url=url, creds_dir=str(tmp_path / "creds")))
        announced: list[int] = []
        done = asyncio.run(suspend_nodes(config, "root", ["node-0"], 0.0, 2.0, 5.0,
                                         lambda runs, _ack: announced.append(runs)))
        assert done.silent == ("node-0",) and done.runs == 0 and not announced
    finally:
        server.kill()
        server.wait()
