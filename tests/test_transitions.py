"""Pure job-record transitions and assignment derivation."""

from __future__ import annotations

from hfai.controller import transitions as tr
from hfai.controller.assignments import desired_assignments, pick_master_port
from hfai.controller.policy import Start, Suspend
from hfai.protocol import reasons
from hfai.protocol.types import ChainState, DesiredRun, JobRecord, JobSpec, RunEvent, RunEventKind

PREEMPTED = reasons.preempted(job="x", priority="HIGH", victim_priority="LOW")

SPEC = JobSpec(name="j", entrypoint=("python", "t.py"), workdir="/w", nodes=2, user="alice")


def running() -> JobRecord:
    j = JobRecord(id="j1", spec=SPEC, state=ChainState.QUEUED, submit_ts=1.0)
    return tr.apply_start(j, Start("j1", ("n0", "n1")), 2.0, "10.0.0.1", 20000)


def exited(node, code, run=1, stopped=False, wls=None):
    return RunEvent(event=RunEventKind.EXITED, node=node, job_id="j1", run_id=run, ts=5.0, exit_code=code,
                    platform_stopped=stopped, whole_life_state=wls)


def test_start_sets_a_new_run():
    j = running()
    assert (j.state, j.run_id, j.nodes, j.master_port) == (ChainState.RUNNING, 1, ("n0", "n1"), 20000)
    assert tr.apply_start(j, Start("j1", ("n2",)), 3.0, "x", 1) is None  # already running


def test_success_needs_every_rank():
    j = tr.apply_event(running(), exited("n0", 0), 6.0)
    assert j.state is ChainState.RUNNING
    j = tr.apply_event(j, exited("n1", 0), 7.0)
    assert j.state is ChainState.SUCCEEDED and j.ended_ts == 7.0


def test_one_failing_rank_fails_the_gang_and_events_are_idempotent():
    j = tr.apply_event(running(), exited("n1", 3), 6.0)
    assert j.state is ChainState.FAILED and "rank 1" in j.reason
    assert tr.apply_event(j, exited("n1", 3), 6.0) is None


def test_suspend_cycle_requeues_without_counting_failure():
    j = tr.apply_suspend(running(), Suspend("j1", PREEMPTED, "x", sliced=True), 3.0)
    assert j.state is ChainState.SUSPENDING and j.slice_turns == 1
    j = tr.apply_event(j, RunEvent(event=RunEventKind.SUSPEND_ACKED, node="n0", job_id="j1", run_id=1, ts=4.0), 4.0)
    j = tr.apply_event(j, RunEvent(event=RunEventKind.SUSPEND_ACKED, node="n1", job_id="j1", run_id=1, ts=4.0), 4.0)
    j = tr.apply_event(j, exited("n0", -15, stopped=True, wls=12), 5.0)
    j = tr.apply_event(j, exited("n1", -15, stopped=True), 5.0)
    assert j.state is ChainState.SUSPENDED and j.suspend_count == 1 and j.nodes == () and j.whole_life_state == 12
    assert "acknowledged" in j.reason and j.submit_ts == 1.0
    again = tr.apply_start(j, Start("j1", ("n1", "n0")), 9.0, "a", 2)
    assert again.run_id == 2 and "resumed" in again.reason


def test_an_exit_that_says_it_acked_counts_as_the_ack():
    """The agent publishes a plan's events together: an EXITED event saying the run acknowledged
    requeues the job even when its SUSPEND_ACKED was lost or comes later (it is then ignored)."""
    j = tr.apply_suspend(running(), Suspend("j1", PREEMPTED, "x", sliced=True), 3.0)
    for node in ("n0", "n1"):
        ev = RunEvent(event=RunEventKind.EXITED, node=node, job_id="j1", run_id=1, ts=5.0, exit_code=0, acked=True)
        j = tr.apply_event(j, ev, 5.0)
    assert j.state is ChainState.SUSPENDED and "acknowledged" in j.reason
    late = RunEvent(event=RunEventKind.SUSPEND_ACKED, node="n0", job_id="j1", run_id=1, ts=5.0)
    assert tr.apply_event(j, late, 6.0) is None
    # Without the ack the same exits mean the job finished its work before it saw the request.
    j = tr.apply_suspend(running(), Suspend("j1", PREEMPTED, "x", sliced=True), 3.0)
    for node in ("n0", "n1"):
        j = tr.apply_event(j, exited(node, 0), 5.0)
    assert j.state is ChainState.SUCCEEDED


def test_stale_events_are_ignored():
    assert tr.apply_event(running(), exited("n0", 1, run=0), 5.0) is None
    assert tr.apply_event(running(), exited("n9", 1), 5.0) is None


def test_node_loss_requeues_and_stop_paths():
    j = tr.apply_node_lost(running(), "n1", 5.0)
    assert j.state is ChainState.SUSPENDED and "lost" in j.reason
    stopping = tr.apply_stop(running(), 5.0, "alice")
    assert stopping.state is ChainState.STOPPING
    assert tr.apply_node_lost(stopping, "n0", 6.0).state is ChainState.STOPPED
    queued = JobRecord(id="q", spec=SPEC, state=ChainState.QUEUED, submit_ts=1.0)
    assert tr.apply_stop(queued, 2.0, "alice").state is ChainState.STOPPED


def test_assignments_are_derived_from_records():
    j = running()
    susp = tr.apply_suspend(j, Suspend("j1", PREEMPTED, "x"), 3.0)
    a = desired_assignments([susp], ["n0", "n1", "n2"], fence=7, ack_window_s=5, kill_window_s=2)
    assert a["n2"].runs == () and a["n0"].fence == 7
    r0, r1 = a["n0"].runs[0], a["n1"].runs[0]
    assert (r0.rank, r1.rank, r0.world_size, r0.desired) == (0, 1, 2, DesiredRun.SUSPEND)
    assert r0.ack_window_s == 5 and r0.master_addr == "10.0.0.1"


def test_master_ports_do_not_collide():
    first = pick_master_port("j", 1, set(), 20000, 100)
    assert pick_master_port("j", 1, set(), 20000, 100) == first
    assert pick_master_port("j", 1, {first}, 20000, 100) != first


def test_expired_finished_jobs_are_forgotten_after_the_retention():
    done = tr.apply_event(tr.apply_event(running(), exited("n0", 0), 6.0), exited("n1", 0), 10.0)
    assert done.state is ChainState.SUCCEEDED and done.ended_ts == 10.0
    alive = running()
    stopped = tr.apply_stop(JobRecord(id="q", spec=SPEC, state=ChainState.QUEUED, submit_ts=1.0), 3.0, "bob")
    jobs = [done, alive, stopped]
    assert tr.expired(jobs, now=12.0, retention_s=5.0) == ["q"]  # ended at 3; j1 ended at 10
    assert tr.expired(jobs, now=16.0, retention_s=5.0) == ["j1", "q"]  # never the running one
    assert tr.expired(jobs, now=1e9, retention_s=0) == []  # 0: keep forever



def test_a_time_slice_countdown_is_rewritten_as_it_runs_down():
    """Its gist keeps the minutes, so the shown turn follows the clock (at most once per interval)."""
    queued = JobRecord(id="q", spec=SPEC, state=ChainState.QUEUED, submit_ts=1.0, reason="queued")
    ten, nine = reasons.time_slice_wait(minutes=10), reasons.time_slice_wait(minutes=9)
    explained = tr.apply_wait_reason(queued, ten)
    assert explained.reason == "waiting for its time slice, next turn in ~10 min"
    assert ten.gist() != nine.gist()
    assert not tr.wait_reason_due(explained, ten, 100.0, 500.0, 30.0)  # the same figure: nothing to write
    assert not tr.wait_reason_due(explained, nine, 100.0, 110.0, 30.0)  # not more often than the interval
    assert tr.wait_reason_due(explained, nine, 100.0, 160.0, 30.0)


def _every_event(job: JobRecord, now: float) -> JobRecord:
    """What the agents send once every rank exits 0, applied one event at a time."""
    for node in job.nodes:
        kinds = ((RunEventKind.SUSPEND_ACKED, RunEventKind.EXITED) if job.state is ChainState.SUSPENDING
                 else (RunEventKind.EXITED,))
        for kind in kinds:
            ev = RunEvent(job_id=job.id, run_id=job.run_id, node=node, event=kind, ts=now,
                          exit_code=0 if kind is RunEventKind.EXITED else None)
            job = tr.apply_event(job, ev, now) or job
    return job


def test_ranks_exited_is_every_rank_s_events_applied():
    nodes = tuple(f"n{i}" for i in range(5))
    base = tr.apply_start(JobRecord(id="j", spec=JobSpec(name="x", entrypoint=("true",), workdir="/", nodes=5),
                                    state=ChainState.QUEUED, submit_ts=1.0), Start("j", nodes), 10.0, "n0", 29500)
    assert base is not None
    suspending = tr.apply_suspend(base, Suspend("j", PREEMPTED, for_job="k"), 20.0)
    stopping = base.transition(ChainState.STOPPING, 20.0, "stopped by its user")
    one = tr.apply_start(JobRecord(id="j", spec=JobSpec(name="x", entrypoint=("true",), workdir="/", nodes=1),
                                   state=ChainState.QUEUED, submit_ts=1.0), Start("j", ("n0",)), 10.0, "n0", 29500)
    cases = [base, suspending, stopping, one]
    # Some ranks already reported (exited, or acknowledged only).
    cases.append(tr.apply_event(base, RunEvent(job_id="j", run_id=1, node="n2", event=RunEventKind.EXITED, ts=15.0,
                                               exit_code=0), 15.0))
    # The last rank exited first: the others' exits end the run.
    cases.append(tr.apply_event(base, RunEvent(job_id="j", run_id=1, node="n4", event=RunEventKind.EXITED, ts=15.0,
                                               exit_code=0), 15.0))
    assert suspending is not None
    cases.append(tr.apply_event(suspending, RunEvent(job_id="j", run_id=1, node="n1",
                                                     event=RunEventKind.SUSPEND_ACKED, ts=21.0), 21.0))
    finals = set()
    for job in cases:
        assert job is not None
        assert tr.ranks_exited(job, 30.0) == _every_event(job, 30.0)
        finals.add(tr.ranks_exited(job, 30.0).state)
    assert finals == {ChainState.SUCCEEDED, ChainState.SUSPENDED, ChainState.STOPPED}
