"""Desired state of every node, derived from the job records alone (pure).

The leader never stores "what it told the agents" anywhere else: after a failover the new leader
derives the same assignments from the same records, so nothing is lost or started twice.
"""

from __future__ import annotations

from collections.abc import Container

from hfai.protocol.types import ChainState, DesiredRun, JobRecord, NodeAssignment, RunAssignment

_DESIRED = {
    ChainState.RUNNING: DesiredRun.RUN,
    ChainState.SUSPENDING: DesiredRun.SUSPEND,
    ChainState.STOPPING: DesiredRun.STOP,
}


FENCE_FRACTION = 0.6


def fence_bound(heartbeat_timeout_s: float) -> float:
    """The self-fencing bound carried in every run (RunAssignment.fence_s) for a leader that
    declares a node lost after ``heartbeat_timeout_s`` without a heartbeat.

    A node's launchers TERM their jobs after FENCE_FRACTION (0.6) of the timeout without an
    accepted heartbeat and KILL them at FENCE_KILL_FACTOR times that (0.8 of the timeout): the last
    fifth is the margin for the launcher's polling (at most fence_s / 8) and the kill itself. So
    when the leader requeues the job of a node that went silent, its orphaned run is already dead
    and cannot write alongside the restarted one. The leader needs no extra wait on its side: its
    timeout *is* the wait. Why not fence sooner: an agent restarted within the bound adopts its
    runs, and a restart (systemd, an upgrade) should not cost every job on the node; 0.6 rather
    than 0.5 of the timeout leaves it 20% more time."""
    if heartbeat_timeout_s <= 0:
        return 0.0
    return FENCE_FRACTION * heartbeat_timeout_s  # tests/test_self_fence.py checks the kill stays inside


def desired_assignments(jobs: list[JobRecord], nodes: list[str], fence: int, ack_window_s: float,
                        kill_window_s: float, fence_s: float = 0.0) -> dict[str, NodeAssignment]:
    """node -> NodeAssignment for every known node (nodes without work get an empty one).
    ``fence_s``: see :func:`fence_bound` (0: runs do not fence themselves)."""
    runs: dict[str, list[RunAssignment]] = {n: [] for n in nodes}
    for job in sorted(jobs, key=lambda j: j.id):
        desired = _DESIRED.get(job.state)
        if desired is None:
            continue
        for rank, node in enumerate(job.nodes):
            runs.setdefault(node, []).append(_run(job, rank, desired, ack_window_s, kill_window_s, fence_s))
    return {n: NodeAssignment(node=n, fence=fence, runs=tuple(rs)) for n, rs in runs.items()}


def _run(job: JobRecord, rank: int, desired: DesiredRun, ack_window_s: float, kill_window_s: float,
         fence_s: float) -> RunAssignment:
    s = job.spec
    return RunAssignment(
        job_id=job.id, run_id=job.run_id, name=s.name, user=s.user, group=s.group, priority=s.priority,
        rank=rank, world_size=len(job.nodes), master_addr=job.master_addr, master_port=job.master_port,
        entrypoint=s.entrypoint, workdir=s.workdir, desired=desired, env_name=s.env_name, env=dict(s.env),
        suspend_count=job.suspend_count, whole_life_state=job.whole_life_state, retry_count=job.retried,
        ack_window_s=ack_window_s, kill_window_s=kill_window_s, fence_s=fence_s, kind=s.kind,
    )


def same_work(a: NodeAssignment | None, b: NodeAssignment) -> bool:
    """True if ``a`` (what the bucket holds) is ``b``: the same runs under the same fence. A value
    of an older fence is always written again, so a new leader's first round stamps its term
    on every node: an old leader's value left in place could be replaced by that old leader's
    late write, which the node would accept."""
    return a is not None and a.fence == b.fence and a.runs == b.runs


def pick_master_port(job_id: str, run_id: int, in_use: Container[int], base: int, span: int) -> int:
    """A port for MASTER_PORT, stable per run and distinct from ports of other live runs."""
    import zlib

    start = zlib.crc32(f"{job_id}.{run_id}".encode()) % span
    for i in range(span):
        port = base + (start + i) % span
        if port not in in_use:
            return port
    raise RuntimeError("no free master port in the configured range")
