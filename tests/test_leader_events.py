"""Forged agent events (issue 11) and the waiting reasons the leader writes: the pure rules, and
the leader's event handler against an in-memory KV (the live forgery test publishes on a real
cluster in test_fault_leader.py)."""

from __future__ import annotations

import asyncio
import logging

from fakes import FakeElection, FakeKV, FakeMsg

from hfai.controller import transitions as tr
from hfai.controller.leader import Leader
from hfai.controller.policy import Start
from hfai.core.config import Config
from hfai.kv import KVCache
from hfai.protocol import decode, encode, names, reasons
from hfai.protocol.types import ChainState, JobRecord, JobSpec, RunEvent, RunEventKind

SPEC = JobSpec(name="train", entrypoint=("python", "t.py"), workdir="/w", nodes=2, user="bob")


def bobs_job() -> JobRecord:
    j = JobRecord(id="j1", spec=SPEC, state=ChainState.QUEUED, submit_ts=1.0, reason="queued")
    return tr.apply_start(j, Start("j1", ("n0", "n1")), 2.0, "10.0.0.1", 20000)


def exited(node: str, code: int = 0, run: int = 1) -> RunEvent:
    return RunEvent(event=RunEventKind.EXITED, node=node, job_id="j1", run_id=run, ts=5.0, exit_code=code)


# ----------------------------------------------------------------------------- pure rules


def test_an_event_must_come_from_the_node_it_names_and_that_holds_the_run():
    j = bobs_job()
    assert tr.event_rejection(j, exited("n0"), "n0") is None
    assert "came from node 'mallory'" in tr.event_rejection(j, exited("n0"), "mallory")
    # The attacker's own node, on its own subject, but not one of the job's nodes.
    assert "not on node mallory" in tr.event_rejection(j, exited("mallory"), "mallory")
    assert "not on node n0" in tr.event_rejection(j, exited("n0", run=2), "n0")  # another run
    done = tr.apply_event(tr.apply_event(j, exited("n0"), 6.0), exited("n1"), 7.0)
    assert done.state is ChainState.SUCCEEDED
    assert "holds no nodes" in tr.event_rejection(done, exited("n0"), "n0")


FULL, RESERVED = reasons.no_nodes(reserved=False), reasons.no_nodes(reserved=True)


def test_wait_gist_drops_the_wording_that_changes_every_round():
    assert FULL.gist() == RESERVED.gist() and FULL.text() != RESERVED.text()
    assert (reasons.too_big(need=4, group="a", usable=3).gist()
            == reasons.too_big(need=5, group="a", usable=2).gist())
    assert FULL.gist() != reasons.preempting().gist()


def test_a_wait_reason_is_written_when_its_gist_changes_at_most_once_per_interval():
    full, reserved = FULL, RESERVED
    queued = JobRecord(id="q", spec=SPEC, state=ChainState.QUEUED, submit_ts=1.0, reason="queued")
    assert tr.wait_reason_due(queued, full, None, 100.0, 30.0)  # the first explanation: at once
    explained = tr.apply_wait_reason(queued, full)
    assert not tr.wait_reason_due(explained, reserved, 100.0, 100.5, 30.0)  # same gist: never
    assert not tr.wait_reason_due(explained, reserved, None, 1e9, 30.0)
    preempting = reasons.preempting()
    assert not tr.wait_reason_due(explained, preempting, 100.0, 110.0, 30.0)  # too soon after the last
    assert tr.wait_reason_due(explained, preempting, 100.0, 130.0, 30.0)
    assert not tr.wait_reason_due(bobs_job(), full, None, 0.0, 30.0)  # running jobs do not wait


def test_a_queue_that_churns_writes_each_waiting_reason_once():
    """100 rounds in which the wording flips every round: one write per job, not one per round."""
    jobs = {f"j{i}": JobRecord(id=f"j{i}", spec=SPEC, state=ChainState.QUEUED, submit_ts=float(i), reason="queued")
            for i in range(20)}
    last: dict[str, float] = {}
    writes = 0
    for rnd in range(100):
        why = FULL if rnd % 2 else RESERVED
        for job_id, j in jobs.items():
            if tr.wait_reason_due(j, why, last.get(job_id), rnd * 0.2, 30.0):
                jobs[job_id], last[job_id] = tr.apply_wait_reason(j, why), rnd * 0.2
                writes += 1
    assert writes == len(jobs)


# --------------------------------------------------------------------- the leader's handler


async def _leader_with(job: JobRecord) -> tuple[Leader, FakeKV]:
    kv = FakeKV()
    kv._put(job.id, encode(job))
    jobs = KVCache(kv, JobRecord)
    return Leader(Config(), None, kv, None, jobs, None, FakeElection(), asyncio.Event()), kv


async def test_forged_events_are_acked_dropped_and_logged_once(caplog):
    leader, kv = await _leader_with(bobs_job())
    caplog.set_level(logging.INFO, logger="hfai.controller.leader")
    forged = [
        FakeMsg(names.event_subject("mallory"), exited("n0")),       # another node's name, own subject
        FakeMsg(names.event_subject("mallory"), exited("mallory")),  # own name, but not bob's node
        FakeMsg(names.event_subject("n0"), exited("n0", run=7)),     # a run that is not running
    ]
    for m in forged:
        await leader._handle_event(m)
    assert all(m.acked for m in forged)
    record = decode((await kv.get("j1")).value, JobRecord)
    assert record.state is ChainState.RUNNING and record.exits == {}
    drops = [r for r in caplog.records if "dropping" in r.getMessage()]
    assert len(drops) == 3, [r.getMessage() for r in caplog.records]

    genuine = [FakeMsg(names.event_subject(n), exited(n)) for n in ("n0", "n1")]
    for m in genuine:
        await leader._handle_event(m)
    record = decode((await kv.get("j1")).value, JobRecord)
    assert all(m.acked for m in genuine) and record.state is ChainState.SUCCEEDED
