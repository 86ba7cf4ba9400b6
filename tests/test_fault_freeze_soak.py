"""Random freezes of either controller during bursts of submits, stops and preemptions (issue 26
§1), on a real cluster: 0 runs of one job alive at once (by the jobs' own log of time and pid),
0 jobs lost, every run ended.

Each cycle freezes the leader or the standby (SIGSTOP), at a random moment or right before the
leader's next assignment write (the fault point of controller/faults.py), for a random time up
to past the lease, while jobs are submitted, stopped, and preempted by higher-priority ones; then
thaws it. ``HFAI_FAULT_FREEZE_CYCLES`` sets the number of cycles (default 6, to keep the suite
short; the figures in issue 26's note come from a run of 50), ``HFAI_FAULT_SEED`` the seed.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
from spine_cluster import Cluster
from test_fault_suite import FAST, Rig, overlapping, runs_by_job

from hfai.api.client import ApiClient
from hfai.controller.faults import ASSIGNMENT_PUT, FREEZE_ENV, arm
from hfai.protocol.types import ChainState, JobSpec

CYCLES = int(os.environ.get("HFAI_FAULT_FREEZE_CYCLES", "6"))
SEED = int(os.environ.get("HFAI_FAULT_SEED", str(int(time.time()))))
TTL_S = FAST["lease_ttl_s"]
NODES = 2
JOB_S = 1.5
HIGH = 30  # preempts the load's NORMAL jobs
# Suspended jobs do not acknowledge: the agent stops them after these windows (seconds).
WINDOWS = dict(ack_window_s=0.3, kill_window_s=1.0)

# A job that logs its start and its end, also when the platform stops it (SIGTERM), in the
# format of tests/jobs/runlog.py; written by the test, so the load needs no new job file.
JOB = """\
import os, signal, sys, time
log, seconds = sys.argv[1], float(sys.argv[2])
job, run = os.environ.get("HFAI_JOB_ID", "?"), os.environ.get("HFAI_RUN_ID", "?")
writer = int.from_bytes(os.urandom(4), "big")  # not the pid: each compute container's job is pid 2
started = False
def line(what):
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{job} {writer} {run} {what} {time.time():.6f}\\n".encode())
    finally:
        os.close(fd)
def stopped(*_):
    if started:
        line("end")
    os._exit(128 + signal.SIGTERM)
signal.signal(signal.SIGTERM, stopped)
line("start")
started = True
time.sleep(seconds)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
line("end")
"""


class SoakRig(Rig):
    def __init__(self, c: Cluster, log: Path, job: Path):
        super().__init__(c, log, JOB_S)
        self.job = job
        self.stop_tried: set[str] = set()

    def spec(self, name: str, seconds: float, priority: int = 10) -> JobSpec:
        return JobSpec(name=name, entrypoint=(sys.executable, str(self.job), str(self.log), str(seconds)),
                       workdir=str(self.log.parent), nodes=1, priority=priority)

    async def api(self, what, timeout: float = 4.0):
        """One API call that may go to a frozen replica: None if it does not answer in time."""
        try:
            async with ApiClient(self.c.config, user="tester") as api:
                return await asyncio.wait_for(what(api), timeout)
        except Exception:
            return None

    async def burst(self, rng: random.Random, k: int) -> None:
        """Submits, and a stop of a running job or a higher-priority job (a preemption: with a
        stop at the same time, it would take the stopped job's node instead)."""
        running = [j.id for j in self.jobs.values() if j.state is ChainState.RUNNING]
        calls = [self._submit_one(f"burst{k}.{i}", 10) for i in range(2)]
        if running and rng.random() < 0.5:
            victim = rng.choice(running)
            self.stop_tried.add(victim)  # a stop whose reply is lost may still have been applied
            calls.append(self.api(lambda api: api.stop(victim)))
        else:
            calls.append(self._submit_one(f"high{k}", HIGH))
        await asyncio.gather(*calls)

    async def _submit_one(self, name: str, priority: int) -> None:
        record = await self.api(lambda api: api.submit(self.spec(name, JOB_S, priority)))
        if record is not None:
            self.submitted.append(record.id)


def check_soak(records, log: Path, submitted: list[str], stop_tried: set[str]) -> dict[str, int]:
    runs = runs_by_job(log)
    missing = [j for j in submitted if j not in records]
    assert not missing, f"submitted jobs with no record (lost): {missing}"
    concurrent = {j: pairs for j, r in runs.items() if (pairs := overlapping(r))}
    assert not concurrent, f"runs of one job alive at once: {concurrent}"
    unended = {j: r for j, r in runs.items() if any(run.end is None for run in r)}
    assert not unended, f"runs that never ended: {unended}"
    for job_id, r in records.items():
        ok = {ChainState.SUCCEEDED, ChainState.STOPPED} if job_id in stop_tried else {ChainState.SUCCEEDED}
        assert r.state in ok, f"job {job_id} ({r.spec.name}) ended {r.state.value}: {r.reason}"
        if r.state is ChainState.SUCCEEDED:
            assert runs.get(job_id), f"job {job_id} succeeded without a run in the log"
    return {"jobs": len(records), "runs": sum(len(r) for r in runs.values()),
            "high-priority": sum(1 for r in records.values() if r.spec.priority == HIGH),
            "preempted": sum(1 for r in records.values() if any("preempt" in e.reason for e in r.history)),
            "runs after an interruption": sum(1 for r in records.values() if r.run_id > 1),
            "stopped": sum(1 for r in records.values() if r.state is ChainState.STOPPED)}


@pytest.mark.slow
def test_random_freezes_of_either_controller_never_double_or_lose_a_job(tmp_path, monkeypatch):
    freeze = tmp_path / "freeze"
    monkeypatch.setenv(FREEZE_ENV, str(freeze))
    job = tmp_path / "job.py"
    job.write_text(JOB)
    log = tmp_path / "runs.log"
    rng = random.Random(SEED)
    print(f"\nseed {SEED}, {CYCLES} cycles")
    with Cluster(tmp_path, nodes=NODES, controllers=2, **FAST, **WINDOWS) as c:
        names = ("controller-0", "controller-1")

        async def go():
            async with SoakRig(c, log, job) as rig:
                rig.feeding = True
                kinds = {"leader": 0, "standby": 0, "at the write": 0}
                t0 = time.monotonic()
                for k in range(CYCLES):
                    await rig.ready_for_a_fault()
                    holder = await rig.holder()
                    burst = asyncio.create_task(rig.burst(rng, k))
                    await _freeze(c, rig, rng, holder, names, freeze, kinds)
                    try:
                        await asyncio.sleep(rng.uniform(0.1, 2.5 * TTL_S))
                    finally:
                        freeze.unlink(missing_ok=True)
                        for n in names:  # both: a late taker of the fault point stops too
                            c.local._procs[n].send_signal(signal.SIGCONT)
                    await burst
                    await rig.until(rig.holder, 10, "a leader after the thaw")
                records = await rig.drain(timeout=120)
                figures = check_soak(records, log, rig.submitted, rig.stop_tried)
                refused = sum(rig.controller_log(n).count("written by a later leader") for n in names)
                print(f"{CYCLES} cycles in {time.monotonic() - t0:.0f}s (freezes: {kinds}); {figures}; "
                      f"late assignment writes refused by the server: {refused}; 0 overlapping runs, 0 lost")
                assert all(c.local.alive()[n] for n in names)

        asyncio.run(go())


async def _freeze(c: Cluster, rig: SoakRig, rng: random.Random, holder: str | None, names, freeze: Path,
                  kinds: dict[str, int]) -> str | None:
    """Freeze one controller; returns its name (None if an armed write point never came)."""
    how = rng.choice(("leader", "standby", "at the write"))
    kinds[how] += 1
    if how == "at the write":
        arm(freeze, ASSIGNMENT_PUT, c.local.node_name(rng.randrange(NODES)))
        try:  # the leader stops itself at its next write to that node
            await rig.until(lambda: not freeze.exists(), 3.0, "the armed write", 0.02)
        except AssertionError:
            freeze.unlink(missing_ok=True)
        await asyncio.sleep(0.1)  # whoever took the file stops itself right after
        return next((n for n in names if _stopped(c.local._procs[n].pid)), None)
    await asyncio.sleep(rng.uniform(0.0, 0.5))  # a random moment
    victim = holder if how == "leader" and holder is not None else rng.choice([n for n in names if n != holder])
    c.local._procs[victim].send_signal(signal.SIGSTOP)
    return victim


def _stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False
