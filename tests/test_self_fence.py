"""Self-fencing (issue 11 defect 2), the pure parts: when a launcher stops its job, the bound the
leader sets, what the agent reports. A dead agent must not mean a duplicate job."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from hfai.agent.launcher import Fence, fence_action, poll_interval, read_stamp
from hfai.agent.plan import LocalRun, RunPhase, fence_problem, platform_stopped
from hfai.agent.runs import fence_spec
from hfai.controller import transitions
from hfai.controller.assignments import desired_assignments, fence_bound
from hfai.controller.policy import Start
from hfai.protocol import decode, encode
from hfai.protocol.types import (
    FENCE_KILL_FACTOR,
    ChainState,
    DesiredRun,
    JobRecord,
    JobSpec,
    RunAssignment,
    RunEvent,
    RunEventKind,
)


def _ra(**kw) -> RunAssignment:
    base = dict(job_id="j1", run_id=1, name="n", user="u", group="default", priority=10, rank=0, world_size=1,
                master_addr="127.0.0.1", master_port=20001, entrypoint=("true",), workdir="/",
                desired=DesiredRun.RUN)
    return RunAssignment(**(base | kw))


# ----------------------------------------------------------------------------- the decision

def test_fresh_stamp_leaves_the_job_alone():
    assert fence_action(now=100.0, last_alive=99.0, fence_s=3.0, fence_kill_s=4.5, termed=False) is Fence.NONE
    assert fence_action(now=100.0, last_alive=97.01, fence_s=3.0, fence_kill_s=4.5, termed=False) is Fence.NONE


def test_stale_stamp_terms_then_kills_at_the_kill_bound():
    assert fence_action(100.0, 97.0, 3.0, 4.5, termed=False) is Fence.TERM
    # Sent TERM already: nothing more until the kill bound, then KILL.
    assert fence_action(101.0, 97.0, 3.0, 4.5, termed=True) is Fence.NONE
    assert fence_action(101.5, 97.0, 3.0, 4.5, termed=True) is Fence.KILL


def test_past_the_kill_bound_it_kills_even_without_a_term_first():
    # The launcher itself was held up (overloaded host): the leader's deadline comes first.
    assert fence_action(110.0, 97.0, 3.0, 4.5, termed=False) is Fence.KILL


@pytest.mark.parametrize("fence_s", [0.0, -1.0, math.nan])
def test_no_bound_means_no_fencing(fence_s):
    assert fence_action(1e9, 0.0, fence_s, 4.5, termed=False) is Fence.NONE


def test_a_stamp_from_the_future_counts_as_fresh():
    assert fence_action(100.0, 105.0, 3.0, 4.5, termed=False) is Fence.NONE


def test_poll_interval_is_capped_by_the_bound():
    assert poll_interval(30.0, 0.5) == 0.5
    assert poll_interval(2.0, 0.5) == 0.25  # an eighth of the bound
    assert poll_interval(0.01, 0.5) == 0.01  # never busier than every 10 ms


def test_read_stamp_tolerates_missing_and_garbled_files(tmp_path):
    p = tmp_path / "alive"
    assert read_stamp(str(p)) is None
    p.write_text("12.5\n")
    assert read_stamp(str(p)) == 12.5
    for junk in ("", "soon", "nan", "inf", "1e999"):
        p.write_text(junk)
        assert read_stamp(str(p)) is None, junk


# ------------------------------------------------------------------------ the leader's bound

@pytest.mark.parametrize("timeout", [0.5, 3.0, 6.0, 10.0, 30.0, 300.0])
def test_an_orphan_is_killed_before_the_leader_may_requeue_its_job(timeout):
    fence_s = fence_bound(timeout)
    kill_at = FENCE_KILL_FACTOR * fence_s
    assert 0 < fence_s < kill_at < timeout
    # The launcher polls at most every poll_interval: detection never reaches the timeout either,
    # whatever [agent] fence_poll_s says.
    assert kill_at + poll_interval(fence_s, 1e9) < timeout
    # ... and leaves a margin of a fifth of the timeout for polling and the kill itself.
    assert timeout - kill_at >= timeout / 5 - 1e-9


def test_no_heartbeat_timeout_means_no_fencing():
    assert fence_bound(0.0) == 0.0


def _running(nodes: tuple[str, ...]) -> JobRecord:
    spec = JobSpec(name="x", entrypoint=("true",), workdir="/", nodes=len(nodes), user="u")
    queued = JobRecord(id="j1", spec=spec, state=ChainState.QUEUED, submit_ts=1.0)
    return transitions.apply_start(queued, Start("j1", nodes), 2.0, "127.0.0.1", 20001)


def test_every_assignment_carries_the_bound():
    job = _running(("a", "b"))
    out = desired_assignments([job], ["a", "b", "c"], fence=7, ack_window_s=5, kill_window_s=2,
                              fence_s=fence_bound(6.0))
    assert [r.fence_s for n in ("a", "b") for r in out[n].runs] == [pytest.approx(3.6)] * 2
    assert out["c"].runs == ()
    # Callers that do not pass it (older code) get 0 = off.
    assert desired_assignments([job], ["a"], 7, 5, 2)["a"].runs[0].fence_s == 0.0


def test_an_assignment_from_an_older_leader_decodes_without_a_bound():
    import msgpack

    ra = _ra(fence_s=3.0)
    assert decode(encode(ra), RunAssignment).fence_s == 3.0
    env = msgpack.unpackb(encode(ra), raw=False)
    del env["b"]["fence_s"]
    assert decode(msgpack.packb(env, use_bin_type=True), RunAssignment).fence_s == 0.0


# -------------------------------------------------------------------------------- the agent

def test_the_launch_spec_gets_the_kill_bound_from_the_protocol(tmp_path):
    spec = fence_spec(3.0, tmp_path / "alive", 0.5)
    assert spec is not None
    assert (spec.alive, spec.fence_s, spec.kill_s, spec.poll_s) == (str(tmp_path / "alive"), 3.0, pytest.approx(4.0),
                                                                     0.5)
    for off in (0.0, -2.0, math.nan, math.inf):
        assert fence_spec(off, tmp_path / "alive", 0.5) is None


def test_a_fenced_exit_is_reported_as_stopped_by_the_platform():
    run = LocalRun(key="j1.1", assignment=_ra(), phase=RunPhase.EXITED, exit_code=-15)
    assert not platform_stopped(run)  # the job's own failure
    assert platform_stopped(replace(run, fenced=True))
    assert platform_stopped(replace(run, term_ts=1.0)) and platform_stopped(replace(run, suspend_ts=1.0))
    assert not platform_stopped(None)


def test_a_bound_too_tight_for_the_heartbeats_is_flagged():
    assert fence_problem(15.0, 5.0) is None
    assert fence_problem(0.0, 5.0) is None
    assert "heartbeat_timeout_s" in fence_problem(3.0, 5.0)


# -------------------------------------------------------------------------------- the leader

def test_an_agent_back_after_the_fence_but_before_the_timeout_gets_its_job_requeued():
    """The agent was gone between fence_s and heartbeat_timeout_s: the leader never saw the node
    down, the launcher stopped the job, the agent is back and reports the exit. That is an
    interruption (requeue), never the user's failure."""
    job = _running(("a",))
    ev = RunEvent(event=RunEventKind.EXITED, node="a", job_id="j1", run_id=1, ts=5.0, exit_code=-15,
                  platform_stopped=True, message="stopped by self-fencing")
    after = transitions.apply_event(job, ev, 5.0)
    assert after is not None and after.state is ChainState.SUSPENDED


def test_a_fenced_rank_of_a_gang_suspends_the_others_then_requeues():
    job = _running(("a", "b"))
    ev = RunEvent(event=RunEventKind.EXITED, node="a", job_id="j1", run_id=1, ts=5.0, exit_code=-9,
                  platform_stopped=True, message="stopped by self-fencing")
    after = transitions.apply_event(job, ev, 5.0)
    assert after is not None and after.state is ChainState.SUSPENDING and "stopped by the platform" in after.reason
    other = RunEvent(event=RunEventKind.EXITED, node="b", job_id="j1", run_id=1, ts=6.0, exit_code=0)
    done = transitions.apply_event(after, other, 6.0)
    assert done is not None and done.state is ChainState.SUSPENDED
