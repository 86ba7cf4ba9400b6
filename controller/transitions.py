"""Pure state changes of job records: applying agent events, policy decisions and node loss.

Each function takes a record and returns the new record, or None when nothing changes, so the
leader can write it with compare-and-set and simply retry on a conflict. Events are idempotent:
a redelivered event (same node, same run) changes nothing the second time.
"""

from __future__ import annotations

from collections.abc import Iterable

from hfai.controller.policy import Start, Suspend
from hfai.protocol import reasons
from hfai.protocol.errors import IllegalTransition
from hfai.protocol.reasons import Reason, describe
from hfai.protocol.types import (
    DEV_IDLE_EXIT,
    JOB_DEV,
    ChainState,
    GpuFaultEvent,
    JobEvent,
    JobRecord,
    RunEvent,
    RunEventKind,
)
from hfai.protocol.types import evolve as replace  # fast: records have no __post_init__


def changes_nothing(ev: RunEvent) -> bool:
    """Whether ``ev`` leaves every record as it is, whatever the record (the leader then need not
    read one): a run's start is news to no record, its end and acks are."""
    return ev.event is RunEventKind.STARTED


def apply_event(job: JobRecord, ev: RunEvent, now: float, dev_idle_s: float = 0.0) -> JobRecord | None:
    """The record after one agent event, or None if the event is stale or already applied.
    ``dev_idle_s``: ``[dev] idle_s``, the figure a session stopped for idleness gives."""
    if ev.job_id != job.id or ev.run_id != job.run_id or job.state.final or not job.state.holds_nodes:
        return None
    if ev.node not in job.nodes:
        return None
    if changes_nothing(ev):
        return None
    if ev.event is RunEventKind.SUSPEND_ACKED:
        if ev.node in job.acked:
            return None
        return replace(job, acked=(*job.acked, ev.node))
    if ev.event is RunEventKind.START_FAILED:
        return _finish(job, ChainState.FAILED, now,
                       reasons.start_failed(node=ev.node, message=ev.message))
    # EXITED
    if ev.node in job.exits:
        return None
    code = ev.exit_code if ev.exit_code is not None else -1
    exits = {**job.exits, ev.node: code}
    wls = ev.whole_life_state if ev.whole_life_state is not None else job.whole_life_state
    # An exit that says its run acknowledged counts as that ack, as SUSPEND_ACKED does: the agent
    # publishes a plan's events together, and one lost or late must not turn an acknowledged
    # interrupt into "finished while being suspended".
    acked = (*job.acked, ev.node) if ev.acked and ev.node not in job.acked else job.acked
    job = replace(job, exits=exits, whole_life_state=wls, acked=acked, peak_bytes=max(job.peak_bytes, ev.peak_bytes),
                  cpu_s=job.cpu_s + ev.cpu_s)
    rank = job.nodes.index(ev.node)
    dev = job.spec.kind == JOB_DEV  # one node: its one exit ends the run
    if dev and job.state is ChainState.RUNNING and not ev.platform_stopped and code == DEV_IDLE_EXIT:
        # Its JupyterLab stopped itself after [dev] idle_s without activity (agent/devsession.py):
        # the session ended as configured, neither the user's success nor a failure to retry.
        return _finish(job, ChainState.STOPPED, now, reasons.dev_idle(idle_s=dev_idle_s))
    if dev and job.state is ChainState.RUNNING and ev.platform_stopped:
        # Its launcher fenced it or its end went unrecorded: a session is never requeued
        # (apply_node_lost says why).
        return _finish(job, ChainState.STOPPED, now,
                       reasons.dev_node_lost(node=ev.node, message=ev.message or "interrupted"))
    if job.state is ChainState.RUNNING and not ev.platform_stopped and ev.hung_s > 0:
        return _hung(job, now, rank, ev)
    if job.state is ChainState.RUNNING and not ev.platform_stopped and code != 0:
        if job.retried < job.spec.retries:
            # --retry: like an interruption, the other ranks are asked to stop first and the
            # job is requeued once every rank has exited (no rank outlives its restart).
            why = reasons.exited(rank=rank, node=ev.node, code=code, retry=(job.retried + 1, job.spec.retries))
            job = replace(job, retried=job.retried + 1, retry_ts=now)
            if len(exits) == len(job.nodes):
                return requeue(job, now, why)
            return job.transition(ChainState.SUSPENDING, now, why)
        # One rank failing fails the gang; the other nodes lose the run from their assignment.
        if ev.oom_limit_bytes:
            return _finish(job, ChainState.FAILED, now,
                           reasons.out_of_memory(rank=rank, node=ev.node, limit=ev.oom_limit_bytes))
        return _finish(job, ChainState.FAILED, now, reasons.exited(rank=rank, node=ev.node, code=code))
    if job.state is ChainState.RUNNING and ev.platform_stopped:
        # The platform stopped a rank (its launcher fenced the job when its agent went silent):
        # an interruption, never the user's failure. The other ranks are asked to suspend, and
        # the job is requeued once every rank has exited, so no rank outlives its restart.
        job = avoiding(job, ev.node)
        if len(exits) == len(job.nodes):
            return requeue(job, now, reasons.platform_stopped(rank=rank, node=ev.node, message=ev.message,
                                                              requeued=True))
        return job.transition(ChainState.SUSPENDING, now,
                              reasons.platform_stopped(rank=rank, node=ev.node, message=ev.message))
    if len(exits) < len(job.nodes):
        return job
    return _all_exited(job, now)


def _hung(job: JobRecord, now: float, rank: int, ev: RunEvent) -> JobRecord:
    """A rank's launcher ended the run as hung (no output for its watchdog time; its stacks are
    in the log): the user's failure, not the platform's, unless ``--restart-on-hang`` grants a
    restart. A restart is a requeue once every rank has exited (the others are asked to stop
    first, as for a --retry), counted in ``hang_restarts``, never in ``retried``."""
    if job.hang_restarts >= job.spec.restart_on_hang:
        return _finish(job, ChainState.FAILED, now, reasons.hung(rank=rank, node=ev.node, silent_s=ev.hung_s))
    job = replace(job, hang_restarts=job.hang_restarts + 1)
    why = reasons.hung(rank=rank, node=ev.node, silent_s=ev.hung_s,
                       restart=(job.hang_restarts, job.spec.restart_on_hang))
    if len(job.exits) == len(job.nodes):
        return requeue(job, now, why)
    return job.transition(ChainState.SUSPENDING, now, why)


def ranks_exited(job: JobRecord, now: float) -> JobRecord:
    """The record once every rank of its run exited 0, as the agents report it (a job being
    interrupted acknowledges first): what the simulator and the start-time estimate play.

    The ranks' exits (and acks) are folded into one copy of the record, and the last rank's exit
    then ends or requeues the run as :func:`apply_event` does with it: a record per event made a
    64-node run cost 4,000 dict copies, and building and checking the last rank's events was
    still a third of the simulator's work per run. tests/test_transitions.py checks the fold
    against applying every event."""
    if not job.state.holds_nodes or not job.nodes:
        return job
    suspending = job.state is ChainState.SUSPENDING
    *first, last = job.nodes
    exits, acked = job.exits, job.acked
    if first:
        exits = {**exits, **{n: 0 for n in first if n not in exits}}
        if suspending:
            acked = (*acked, *(n for n in first if n not in acked))
    # The last rank's events, as apply_event takes them: its ack (if asked), then its exit.
    if suspending and last not in acked:
        acked = (*acked, last)
    if last not in exits:  # else its exit was reported already: the others' end the run
        exits = {**exits, last: 0}
    job = replace(job, exits=exits, acked=acked)
    return job if len(job.exits) < len(job.nodes) else _all_exited(job, now)


def _all_exited(job: JobRecord, now: float) -> JobRecord:
    codes = job.exits
    if job.state is ChainState.SUSPENDING:
        if all(c == 0 for c in codes.values()) and not job.acked:
            # It finished its work before it saw the suspend request.
            return _finish(job, ChainState.SUCCEEDED, now, reasons.finished_suspending())
        how = reasons.acknowledged if len(job.acked) == len(job.nodes) else reasons.not_acknowledged
        return requeue(job, now, how(cause=describe(job)))
    if job.state is ChainState.STOPPING:
        return _finish(job, ChainState.STOPPED, now, job.why or job.reason or "stopped")
    if all(c == 0 for c in codes.values()):
        return _finish(job, ChainState.SUCCEEDED, now, reasons.succeeded())
    listed = ", ".join(f"{n}={codes[n]}" for n in job.nodes if n in codes)
    return _finish(job, ChainState.FAILED, now, reasons.exit_codes(codes=listed))


def _finish(job: JobRecord, state: ChainState, now: float, why: str | Reason) -> JobRecord:
    return job.transition(state, now, why, ended_ts=now)


def requeue(job: JobRecord, now: float, why: str | Reason) -> JobRecord:
    """Back in line (SUSPENDED) keeping the original submit time; never counted as a failure. A
    run that failed and is retried (``retry_ts`` set) counts in ``retried``, not as a suspension."""
    suspensions = job.suspend_count if job.retry_ts else job.suspend_count + 1
    return job.transition(
        ChainState.SUSPENDED, now, why,
        suspend_count=suspensions, nodes=(), exits={}, acked=(), master_addr="", master_port=0,
        run_s=job.run_s + max(0.0, now - job.started_ts), queued_ts=now,
    )


def apply_start(job: JobRecord, d: Start, now: float, master_addr: str, master_port: int) -> JobRecord | None:
    if not job.state.waiting:
        return None
    why = (reasons.resumed if job.run_id > 0 else reasons.started)(nodes=", ".join(d.nodes))
    return job.transition(
        ChainState.RUNNING, now, why,
        run_id=job.run_id + 1, nodes=d.nodes, last_nodes=d.nodes, exits={}, acked=(), started_ts=now,
        master_addr=master_addr, master_port=master_port, retry_ts=0.0, avoid=(),
    )


def retry_backoff(retried: int, base_s: float, max_s: float) -> float:
    """Seconds a job waits before its ``retried``-th retry: ``base_s`` doubling per retry, at
    most ``max_s`` (a run that fails at once does not restart in a tight loop)."""
    if retried <= 0 or base_s <= 0:
        return 0.0
    return min(max_s, base_s * 2.0 ** min(retried - 1, 60))


def retry_wait(job: JobRecord, now: float, base_s: float, max_s: float, waited: float | None = None) -> float:
    """Seconds left of a waiting job's backoff after a failed run (0: it may start). ``waited``:
    the seconds since the retry was set as the leader measured them (controller/runclock.py); else
    ``now - retry_ts``, which is right only on the clock that wrote the stamp (the simulator's)."""
    if not job.retry_ts or not job.state.waiting:
        return 0.0
    if waited is None:
        waited = now - job.retry_ts
    return max(0.0, retry_backoff(job.retried, base_s, max_s) - waited)


def apply_suspend(job: JobRecord, d: Suspend, now: float) -> JobRecord | None:
    if job.state is not ChainState.RUNNING:
        return None
    turns = job.slice_turns + 1 if d.sliced else job.slice_turns
    return job.transition(ChainState.SUSPENDING, now, d.why, slice_turns=turns)


def apply_platform_stop(job: JobRecord, now: float, why: Reason) -> JobRecord | None:
    """The platform ends the job (time limit, a dependency that can never be met): a waiting job
    stops at once, a running one through the stop protocol (it may save what it has)."""
    if job.state.final or job.state is ChainState.STOPPING:
        return None
    if job.state.waiting:
        return _finish(job, ChainState.STOPPED, now, why)
    if job.state is ChainState.SUSPENDING:
        return None  # its run is ending anyway; the next round stops the waiting job
    return job.transition(ChainState.STOPPING, now, why)


def run_time(job: JobRecord, now: float, ran: float | None = None) -> float:
    """Seconds the job ran over all its runs: its earlier runs' ``run_s`` and ``ran``, its
    current run's time as the leader measured it (controller/runclock.py), or else ``now -
    started_ts`` (one clock only, as in the simulator: the wall stamps of two hosts differ by
    their skew)."""
    return job.run_s + (now - job.started_ts if ran is None else ran)


def time_limit_reached(job: JobRecord, now: float, ran: float | None = None) -> bool:
    """Has a running job used up its --time over all its runs (``ran``: see :func:`run_time`)?"""
    limit = job.spec.time_limit_s
    return limit > 0 and job.state is ChainState.RUNNING and run_time(job, now, ran) >= limit


def apply_hold(job: JobRecord, by: str, hold: bool) -> JobRecord:
    """Hold a waiting job (it is not started until released) or release it. Raises for a job
    that is not waiting: holding a running one would need an interruption, which is requeue's."""
    if not job.state.waiting:
        raise IllegalTransition(f"job {job.id} is {job.state.value}: only a waiting job can be "
                                f"{'held' if hold else 'released'} (hfai requeue interrupts a running one)")
    if hold:
        if job.hold == by:
            return job
        why = held_reason(job, by)
        return replace(job, hold=by, reason=why.text(), why=why)
    if not job.hold:
        return job
    why = reasons.released(by=by)
    return replace(job, hold="", reason=why.text(), why=why)


def held_reason(job: JobRecord, by: str | None = None) -> Reason:
    return reasons.held(by=by or job.hold, job=job.id)


def apply_requeue(job: JobRecord, now: float, by: str) -> JobRecord:
    """Interrupt a running job through the normal protocol; it keeps its place in line."""
    if job.state is not ChainState.RUNNING:
        raise IllegalTransition(f"job {job.id} is {job.state.value}: only a running job can be requeued")
    return job.transition(ChainState.SUSPENDING, now, reasons.requeued_by(by=by))


def apply_update(job: JobRecord, priority: int | None, nodes: int | None) -> JobRecord:
    """A waiting job with another priority and/or node count (validated by the caller)."""
    if not job.state.waiting:
        raise IllegalTransition(f"job {job.id} is {job.state.value}: only a waiting job can be changed")
    spec = job.spec
    if priority is not None:
        spec = replace(spec, priority=priority)
    if nodes is not None:
        if spec.elastic:
            raise IllegalTransition(f"job {job.id} is elastic: its node range cannot be changed")
        spec = replace(spec, nodes=nodes)
    return replace(job, spec=spec)


def apply_wait_reason(job: JobRecord, why: Reason) -> JobRecord | None:
    if not job.state.waiting or job.why == why:
        return None
    # A wait reason is not a state change: no history entry, or the history would fill with noise.
    return replace(job, reason=why.text(), why=why)


def wait_reason_due(job: JobRecord, why: Reason, last_written: float | None, now: float,
                    interval_s: float) -> bool:
    """Should the leader write ``why`` into this waiting job's record now?

    Only when its gist (:meth:`Reason.gist`: the code, not the figures that change from round
    to round, except a time-slice turn's countdown) differs from the reason the record holds
    (a record with a text reason only: always), and at most once per
    ``interval_s`` per job (``last_written``: when this leader last wrote one, None: never), so a
    job torn between two gists does not flap either. Rewriting each round's wording would cost a CAS
    write per waiting job per round: hundreds of writes per job on a busy queue."""
    if not job.state.waiting or (job.why is not None and why.gist() == job.why.gist()):
        return False
    return last_written is None or now - last_written >= interval_s


def event_rejection(job: JobRecord, ev: RunEvent, subject_node: str) -> str | None:
    """Why an agent event must not touch this record (None: it may): it arrived on another node's
    subject than the node it names, or that node does not hold the event's run now. NATS lets an
    agent publish only on its own node's subject, so a forged event for someone else's job (issue
    11: a fake EXITED 0 "finished" bob's job) fails one of the two checks."""
    if ev.node != subject_node:
        return f"it names node {ev.node!r} but came from node {subject_node!r}"
    if ev.job_id != job.id or ev.run_id != job.run_id or not job.state.holds_nodes or ev.node not in job.nodes:
        held = ", ".join(job.nodes) if job.state.holds_nodes and job.nodes else "no nodes"
        return f"run {ev.run_id} of job {ev.job_id} is not on node {ev.node} (run {job.run_id} holds {held})"
    return None


def apply_node_lost(job: JobRecord, node: str, now: float) -> JobRecord | None:
    """A node of the job stopped heartbeating: requeue (or finish a stop); not a user failure.

    A running development session ends instead: what it was, its kernels and terminals, is gone
    with the node, and a requeued one would wait in line holding its user's [dev] max_per_user
    and come back, unasked, as an empty JupyterLab the user's open page quietly reconnects to."""
    if not job.state.holds_nodes or node not in job.nodes:
        return None
    if job.state is ChainState.STOPPING:
        return _finish(job, ChainState.STOPPED, now, reasons.node_lost(node=node, cause=describe(job)))
    if job.spec.kind == JOB_DEV and job.state is ChainState.RUNNING:
        return _finish(job, ChainState.STOPPED, now, reasons.dev_node_lost(node=node))
    return requeue(avoiding(job, node), now, reasons.node_lost(node=node))


def avoiding(job: JobRecord, node: str) -> JobRecord:
    """``job`` set to avoid ``node`` on its next start (a node-class fault interrupted it there)."""
    return job if node in job.avoid else replace(job, avoid=(*job.avoid, node))


def apply_gpu_fault(job: JobRecord, ev: GpuFaultEvent) -> JobRecord | None:
    """A GPU fault under the job's run, kept in ``JobRecord.faults`` (no state change; the
    history holds only the states entered, which usage and the timeline count): the node and the
    fault, and whether it was the job's own (an application Xid) or the hardware's. None when the
    run is over or the fault is there already (a redelivered event)."""
    if ev.job_id != job.id or ev.run_id != job.run_id or not job.state.holds_nodes or ev.node not in job.nodes:
        return None
    why = reasons.at_node(ev.fault.why, ev.node)
    if any(e.why == why and e.ts == ev.fault.ts for e in job.faults):
        return None
    line = JobEvent(ts=ev.fault.ts, state=job.state, reason=why.text(), why=why)
    return replace(job, faults=(*job.faults, line)[-JobRecord.FAULTS_LIMIT:])


def apply_stop(job: JobRecord, now: float, by: str) -> JobRecord | None:
    """A user's stop: waiting jobs stop at once, running ones are asked to stop."""
    if job.state.final or job.state is ChainState.STOPPING:
        return None
    why = reasons.stopped_by(by=by)
    if job.state.waiting:
        return _finish(job, ChainState.STOPPED, now, why)
    return job.transition(ChainState.STOPPING, now, why)


def expired(jobs: Iterable[JobRecord], now: float, retention_s: float) -> list[str]:
    """Ids of finished jobs that ended more than ``retention_s`` ago (none when it is 0 or less):
    their records are dropped so that the job bucket, and every controller's copy of it, does not
    grow with every job the cluster ever ran."""
    if retention_s <= 0:
        return []
    cutoff = now - retention_s
    return sorted(j.id for j in jobs if j.state.final and (j.ended_ts or j.submit_ts) < cutoff)
