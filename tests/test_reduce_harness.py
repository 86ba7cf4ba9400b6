"""Harness for the hfai.reduce tests: run a function on N real local ranks (spawned processes,
torch.distributed over gloo on CPU), with a hard deadline, and collect every rank's outcome.

Also tests the harness itself, so a broken harness cannot make the other tests pass vacuously.
"""

from __future__ import annotations

import os
import queue as queue_mod
import signal
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import pytest
import torch.multiprocessing as mp
from ports import free_port

# Starts processes (a cluster or torch workers): seconds each; `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

#: The gloo default group's own timeout; every test's own waits are shorter.
PG_TIMEOUT_S = 30


@dataclass(frozen=True)
class Outcome:
    rank: int
    ok: bool
    value: object = None
    error_type: str = ""
    message: str = ""
    exitcode: int | None = None



def _entry(fn, rank, world, port, results, args) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=PG_TIMEOUT_S),
    )
    try:
        value = fn(rank, world, *args)
        results.put(Outcome(rank, True, value))
    except BaseException as e:  # reported to the parent, which decides what was expected
        msg = f"{e}\n{traceback.format_exc()}"
        results.put(Outcome(rank, False, None, type(e).__name__, msg))
    # Flush the result, then leave at once: a rank whose peers died must not block in teardown.
    results.close()
    results.join_thread()
    os._exit(0)


def run_ranks(fn, world: int, *args, deadline_s: float = 60.0) -> dict[int, Outcome]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned ranks; return each rank's outcome.

    A rank that exits without reporting (killed) gets ``ok=False, error_type="exit"`` and its
    exit code. Ranks still running at ``deadline_s`` are killed and reported as ``"deadline"``.
    """
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world, port, results, args), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    outcomes: dict[int, Outcome] = {}
    end = time.monotonic() + deadline_s
    while len(outcomes) < world and time.monotonic() < end:
        try:
            o = results.get(timeout=0.2)
            outcomes[o.rank] = o
        except queue_mod.Empty:
            if all(not p.is_alive() for p in procs):
                # Drain what the last exiting ranks flushed before giving up on the rest.
                while True:
                    try:
                        o = results.get(timeout=0.5)
                        outcomes[o.rank] = o
                    except queue_mod.Empty:
                        break
                break
    for r, p in enumerate(procs):
        p.join(timeout=max(0.1, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(5)
            outcomes.setdefault(r, Outcome(r, False, error_type="deadline", exitcode=p.exitcode))
        outcomes.setdefault(r, Outcome(r, False, error_type="exit", exitcode=p.exitcode))
    return outcomes


def assert_all_ok(outcomes: dict[int, Outcome]) -> list:
    bad = [o for o in outcomes.values() if not o.ok]
    assert not bad, "\n".join(f"rank {o.rank}: {o.error_type}: {o.message}" for o in bad)
    return [outcomes[r].value for r in sorted(outcomes)]


def shm_segments() -> set[str]:
    from hfai.reduce.shm import list_segments

    return set(list_segments())


@pytest.fixture
def no_leaked_segments():
    """Fail the test if it leaves a new hfai.reduce segment in /dev/shm."""
    before = shm_segments()
    yield
    leaked = shm_segments() - before
    assert not leaked, f"leaked shared-memory segments: {sorted(leaked)}"


# --- self-tests of the harness -----------------------------------------------------------------


def _value_error_or_death(rank, world):
    if rank == 1:
        raise ValueError("boom")
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return (rank, world)


def _hang(rank, world):
    threading.Event().wait()  # for ever: only the deadline ends it


@pytest.mark.timeout(60)
def test_harness_reports_values_errors_and_deaths():
    out = run_ranks(_value_error_or_death, 3)
    assert out[0].ok and out[0].value == (0, 3)
    assert not out[1].ok and out[1].error_type == "ValueError"
    assert out[2].error_type == "exit" and out[2].exitcode == -signal.SIGKILL
    with pytest.raises(AssertionError, match="boom"):
        assert_all_ok(out)
    # Alive at the deadline (whether still starting or hung): killed and reported as such.
    out = run_ranks(_hang, 1, deadline_s=2)
    assert out[0].error_type == "deadline"
