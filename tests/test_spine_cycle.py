"""Integration: the time-sharing cycle with real processes, and a job that ignores interrupts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from ports import free_port
from spine_cluster import JOBS, REPO, Cluster

from hfai.protocol.types import ChainState, Priority

# Starts real clusters (nats-server, controllers, agents): excluded by `pytest -m "not slow"`.
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")

TRAIN = str(REPO / "examples" / "train.py")
TRAIN_ARGS = ["--steps", "40", "--step-time", "0.05", "--seed", "7"]



def _reference_run(workdir, out) -> None:
    """The same 2-rank training, uninterrupted, outside the platform."""
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = dict(os.environ, WORLD_SIZE="2", RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        env.pop("HFAI_CONTROL_DIR", None)
        procs.append(subprocess.Popen([sys.executable, TRAIN, *TRAIN_ARGS, "--out", str(out),
                                       "--ckpt-dir", str(workdir / "ref_ckpt")], env=env, cwd=workdir))
    for p in procs:
        assert p.wait(timeout=120) == 0


def test_preempted_job_checkpoints_resumes_and_matches_uninterrupted_run(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    _reference_run(work, work / "reference.pt")

    with Cluster(tmp_path / "cluster", nodes=2) as c:
        low = c.submit(["python", TRAIN, *TRAIN_ARGS, "--out", str(work / "final.pt")], name="low", nodes=2,
                       priority=Priority.LOW, workdir=work)
        c.wait_state(low.id, ChainState.RUNNING)
        try:
            # Two launchers importing torch and joining a gloo group on two shared cores: a full
            # suite's run once took over 60 s to reach step 10 (alone: under 10 s).
            c.wait(lambda: "step 10 " in c.log(low.id), 120, "the low-priority job to train a few steps")
        except AssertionError as e:
            j = c.job(low.id)
            tail = c.log(low.id)[-2000:]
            raise AssertionError(f"{e}; it is {j.state.value} ({j.reason}), its log:\n{tail}") from None
        high = c.submit(["python", TRAIN, "--steps", "3", "--step-time", "0", "--ckpt-dir", str(work / "hi")],
                        name="high", nodes=1, priority=Priority.HIGH, workdir=work)
        c.wait_state(low.id, ChainState.SUSPENDED, timeout=30)
        c.wait_state(high.id, ChainState.SUCCEEDED, timeout=60)
        done = c.wait_state(low.id, ChainState.SUCCEEDED, timeout=90)

        assert done.suspend_count == 1 and done.run_id == 2
        states = [e.state for e in done.history]
        assert states == [ChainState.QUEUED, ChainState.RUNNING, ChainState.SUSPENDING, ChainState.SUSPENDED,
                          ChainState.RUNNING, ChainState.SUCCEEDED]
        assert "acknowledged" in done.history[3].reason
        assert "resumed from step" in c.log(low.id)
        assert done.whole_life_state > 0  # set by the job at its checkpoint, carried to the next run

        ps = c.cli("ps", "-a")
        assert ps.returncode == 0, ps.stderr
        row = next(line for line in ps.stdout.splitlines() if line.startswith(low.id))
        assert row.split()[5:7] == ["succeeded", "1"]

    final = torch.load(work / "final.pt")
    reference = torch.load(work / "reference.pt")
    assert final.keys() == reference.keys()
    for key in final:
        assert torch.equal(final[key], reference[key]), key


def test_job_ignoring_the_interrupt_is_killed_after_the_windows_and_requeued(tmp_path):
    with Cluster(tmp_path, nodes=1, ack_window_s=1.5, kill_window_s=1.0) as c:
        stubborn = c.submit(["bash", str(JOBS / "stubborn.sh")], name="stubborn", priority=Priority.LOW)
        c.wait_state(stubborn.id, ChainState.RUNNING)
        c.wait(lambda: "stubborn job" in c.log(stubborn.id), 20, "the stubborn job to print")
        high = c.submit(["python", "-c", "print('urgent work done')"], name="urgent", priority=Priority.HIGH)
        # Requeued: SUSPENDED may last only a moment (the urgent job's run is over in ~50 ms and the
        # stubborn one resumes), so look for it in the history rather than wait to catch it.
        requeued = c.wait(lambda: (j := c.job(stubborn.id)).suspend_count >= 1 and j, 30, "the stubborn job's requeue")
        at = next(i for i, e in enumerate(requeued.history) if e.state is ChainState.SUSPENDED)
        suspending, suspended = requeued.history[at - 1], requeued.history[at]
        assert suspending.state is ChainState.SUSPENDING
        # Not acknowledged: it took at least the acknowledgement window plus the kill window.
        assert suspended.ts - suspending.ts >= 1.5 + 1.0 - 0.3
        assert "stopped after the interrupt windows" in suspended.reason
        assert requeued.suspend_count == 1 and requeued.state is not ChainState.FAILED
        c.wait_state(high.id, ChainState.SUCCEEDED)
        again = c.wait_state(stubborn.id, ChainState.RUNNING)
        assert again.run_id == 2

        stop = c.cli("stop", stubborn.id)
        assert stop.returncode == 0, stop.stderr
        c.wait_state(stubborn.id, ChainState.STOPPED, timeout=20)
