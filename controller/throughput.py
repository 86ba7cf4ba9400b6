"""A job's measured throughput kept in its record (pure): what the gain policy sizes it by.

The agent of a run's rank 0 relays the rate the job measured over a window
(:class:`~hfai.protocol.types.RunThroughput`, agent/throughput.py). The record keeps one
:class:`~hfai.protocol.types.SizeRate` per size the job ran at: the windows' average weighted by
their seconds, where what was measured before counts for at most :data:`MEMORY_S`, so a job whose
speed changes (a new phase of training) is soon measured as it is now. A job that changes its
unit (it began reporting samples) starts its measurements over: rates in two units do not compare.
A rigid job, whose rate decides nothing, is measured for :data:`MEMORY_S` at its size and then
left alone.

The restart cost a resize must pay for (``JobRecord.restart_s``) is measured too: how long the
job's latest interruption took, from the leader's decision to suspend it to its requeue (its
history, on the leader's clock), plus how long its next run took from its start to its first step
(the window's ``startup_s``, on its node's clock).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from hfai.protocol.nodes import NodeRecord
from hfai.protocol.types import ChainState, JobRecord, RunThroughput, SizeRate
from hfai.protocol.types import evolve as replace

#: Seconds of earlier measurements at a size that weigh against a new window at most.
MEMORY_S = 600.0
# What of the utilisation kept per size the policy sees (UTIL_MIN_S, persistent_utilization) is
# in hfai.protocol.speedup: `hfai status` and the job page say the same without the controller.


def _avg(old: float | None, old_s: float, new: float, new_s: float) -> float:
    if old is None:
        return new
    w = min(old_s, MEMORY_S)
    return (old * w + new * new_s) / (w + new_s)


def merged(rates: tuple[SizeRate, ...], nodes: int, rate: float, seconds: float,
           gpu_util: float | None = None) -> tuple[SizeRate, ...]:
    """``rates`` with a window of ``rate`` over ``seconds`` on ``nodes`` nodes averaged in, and
    the GPU utilisation of its nodes meanwhile (None: unknown, the size's stays as it was)."""
    old = next((r for r in rates if r.nodes == nodes), None) or SizeRate(nodes=nodes, rate=rate, seconds=0.0)
    new = replace(old, rate=_avg(old.rate, old.seconds, rate, seconds), seconds=old.seconds + seconds)
    if gpu_util is not None:
        new = replace(new, gpu_util=_avg(old.gpu_util, old.util_s, gpu_util, seconds), util_s=old.util_s + seconds)
    return tuple(sorted((*(r for r in rates if r.nodes != nodes), new), key=lambda r: r.nodes))


def nodes_utilization(records: Mapping[str, NodeRecord], nodes: Iterable[str]) -> float | None:
    """The mean utilisation (%) of the GPUs of ``nodes`` as their latest heartbeats said (the
    agent samples NVML), or None where no heartbeat of theirs reports a GPU."""
    utils = [g.utilization for n in nodes if (r := records.get(n)) is not None for g in r.gpus]
    return sum(utils) / len(utils) if utils else None


def last_suspension_s(job: JobRecord) -> float:
    """Seconds the job's latest interruption took: from entering SUSPENDING to being requeued
    (0: never interrupted)."""
    for i in range(len(job.history) - 1, 0, -1):
        ev = job.history[i]
        if ev.state is ChainState.SUSPENDED:
            before = job.history[i - 1]
            return max(0.0, ev.ts - before.ts) if before.state is ChainState.SUSPENDING else 0.0
    return 0.0


def apply_throughput(job: JobRecord, ev: RunThroughput, gpu_util: float | None = None) -> JobRecord | None:
    """The record with ``ev``'s window kept, or None when it is not for the job's running rank 0
    (a late window of an earlier run, another node's). A suspending job's window counts: its
    last, written as it exited (agent/throughput.py). ``gpu_util``: the utilisation of the job's
    nodes (:func:`nodes_utilization`) when the window came."""
    if (ev.job_id != job.id or ev.run_id != job.run_id
            or job.state not in (ChainState.RUNNING, ChainState.SUSPENDING)
            or not job.nodes or ev.node != job.nodes[0]):
        return None
    if ev.seconds <= 0 or ev.rate < 0:
        return None
    if not job.spec.elastic and any(r.nodes == len(job.nodes) and r.seconds >= MEMORY_S for r in job.throughput):
        # A rigid job's rate is only shown, never decides anything: measured long enough, its
        # record is left alone (a write per window of every running job would cost the store).
        return None
    rates = job.throughput if ev.unit == (job.throughput_unit or ev.unit) else ()
    restart = last_suspension_s(job) + ev.startup_s if job.suspend_count else job.restart_s
    if job.state is ChainState.SUSPENDING:
        gpu_util = None  # its GPUs idle while it checkpoints: no evidence of how it scales
    return replace(job, throughput=merged(rates, len(job.nodes), ev.rate, ev.seconds, gpu_util),
                   throughput_unit=ev.unit,
                   restart_s=restart)
