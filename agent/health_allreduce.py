"""The validator's in-node all-reduce (agent/health_check.py): a few local processes, one per GPU
(on simulated GPUs, two over CPU tensors), all-reduce one buffer through hfreduce (hfai.reduce)
a few rounds; the step checks the sum and compares the bus bandwidth with ``[agent]
health_allreduce_floor_gbps``.

Each rank is its own interpreter, ``python -m hfai.agent.health_allreduce RANK WORLD STORE DEVICE
BYTES ROUNDS TIMEOUT_S``, so torch is imported there and never in the agent. The ranks meet
through a file store in a private temporary folder (no port to pick or to race for), and each
prints one JSON line: its seconds per round, or what went wrong. :func:`run_allreduce` starts
them, kills what is left at its deadline, and :func:`judge` (pure) says what failed.

The bus bandwidth is NCCL's measure, so the figures compare with nccl-tests': the buffer's bytes
over the time of one round, times ``2 (n - 1) / n``, the share of the data each rank sends and
receives in a ring all-reduce; timed on the slowest rank.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass

#: ``[agent] health_allreduce``: run the step on real GPUs only (with torch and CUDA), on
#: simulated GPUs too (over CPU tensors: a few seconds of torch start-up in each agent start), or
#: never.
ALLREDUCE_GPUS = "gpus"
ALLREDUCE_ALWAYS = "always"
ALLREDUCE_NEVER = "never"
ALLREDUCE_MODES = (ALLREDUCE_GPUS, ALLREDUCE_ALWAYS, ALLREDUCE_NEVER)

#: Processes on simulated GPUs: enough for a real shared-memory round, few enough for a CPU box.
SIMULATED_RANKS = 2


@dataclass(frozen=True)
class AllreduceSettings:
    """``[agent] health_allreduce``, ``health_allreduce_floor_gbps``, ``health_allreduce_bytes``
    (hfai.core.config); ``rounds`` timed after one checked warm-up round."""

    mode: str = ALLREDUCE_GPUS
    floor_gbps: float = 1.0
    nbytes: int = 64 * 2**20
    rounds: int = 5

    def __post_init__(self) -> None:
        if self.mode not in ALLREDUCE_MODES:
            raise ValueError(f"[agent] health_allreduce must be one of {', '.join(ALLREDUCE_MODES)}, not {self.mode!r}")


@dataclass(frozen=True)
class RankResult:
    """One rank's report: its seconds per timed round, or ``error`` (what went wrong)."""

    rank: int
    seconds: float = 0.0
    error: str = ""


def bus_gbps(nbytes: int, world: int, seconds: float) -> float:
    """NCCL's bus bandwidth of an all-reduce of ``nbytes`` among ``world`` ranks in ``seconds``, GB/s."""
    if world < 2 or seconds <= 0:
        return 0.0
    return nbytes / seconds * 2 * (world - 1) / world / 1e9


def judge(results: Sequence[RankResult], world: int, nbytes: int, floor_gbps: float,
          what: str = "GPU") -> tuple[str, float]:
    """Pure: what failed ('' : passed) and the bus bandwidth, timed on the slowest rank (0 when
    a rank failed or did not report). ``what`` names a rank's device in the words."""
    by_rank = {r.rank: r for r in results}
    bad = [f"{what} {r}: {by_rank[r].error}" if r in by_rank else f"{what} {r}: its rank did not report"
           for r in range(world) if r not in by_rank or by_rank[r].error]
    if bad:
        return "; ".join(bad), 0.0
    gbps = bus_gbps(nbytes, world, max(r.seconds for r in results))
    if gbps < floor_gbps:
        return (f"bus bandwidth {gbps:.2f} GB/s among {world} ranks, below the floor of {floor_gbps:g} GB/s "
                "([agent] health_allreduce_floor_gbps)"), gbps
    return "", gbps


def run_allreduce(world: int, device: str, settings: AllreduceSettings, timeout_s: float) -> tuple[str, float]:
    """Run the all-reduce on ``world`` local processes over ``device`` ("cuda": rank r on GPU r;
    "cpu"), ended by ``timeout_s``; returns :func:`judge`'s verdict."""
    if world < 2:
        return "", 0.0  # one GPU: nothing to all-reduce in the node
    store = tempfile.mkdtemp(prefix="hfai-health-allreduce-")
    deadline = time.monotonic() + timeout_s
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(world):
            argv = [sys.executable, "-m", "hfai.agent.health_allreduce", str(rank), str(world),
                    os.path.join(store, "rendezvous"), device, str(settings.nbytes), str(settings.rounds),
                    f"{timeout_s:.3f}"]
            # Into files, not pipes: a rank that writes much (warnings) never blocks on a full pipe.
            with open(os.path.join(store, f"rank{rank}.out"), "wb") as out:
                procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                              cwd=store, start_new_session=True))
        results = [_collect(rank, p, store, deadline, timeout_s) for rank, p in enumerate(procs)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        shutil.rmtree(store, ignore_errors=True)
    return judge(results, world, settings.nbytes, settings.floor_gbps, "GPU" if device == "cuda" else "rank")


def _collect(rank: int, p: subprocess.Popen, store: str, deadline: float, timeout_s: float) -> RankResult:
    try:
        p.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return RankResult(rank, error=f"no result within {timeout_s:g} s")
    with open(os.path.join(store, f"rank{rank}.out"), "rb") as f:
        lines = f.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        try:
            got = json.loads(line)
            return RankResult(rank, seconds=float(got.get("seconds", 0.0)), error=str(got.get("error", "")))
        except (ValueError, AttributeError, TypeError):
            continue
    tail = lines[-1:] or [f"exit status {p.returncode}"]
    return RankResult(rank, error=f"exited without a result ({tail[0][:200]})")


# ------------------------------------------------------------------------------ one rank


def _rank_main(rank: int, world: int, store: str, device: str, nbytes: int, rounds: int, timeout_s: float) -> dict:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import hfai.reduce as hr

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        # Rank r on GPU r; more ranks than GPUs share them (bench/gpu_check.sh on a one-GPU machine).
        gpu = rank % max(1, torch.cuda.device_count()) if device == "cuda" else 0
        if device == "cuda":
            torch.cuda.set_device(gpu)
        dev = torch.device(f"cuda:{gpu}" if device == "cuda" else "cpu")
        hr.init(config=hr.ReduceConfig(timeout_s=timeout_s))
        t = torch.full((max(1, nbytes // 4),), float(rank + 1), dtype=torch.float32, device=dev)
        hr.allreduce(t)  # the warm-up round, checked: every element is 1 + 2 + ... + world
        want = world * (world + 1) / 2
        if not bool((t == want).all()):
            return {"error": f"the in-node sum is wrong ({float(t.min()):g}..{float(t.max()):g}, not {want:g})"}
        t.fill_(1.0)  # the timed rounds multiply it by world each: stays exact in float32
        if device == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        began = time.perf_counter()
        for _ in range(rounds):
            hr.allreduce(t)
        if device == "cuda":
            torch.cuda.synchronize()
        return {"seconds": (time.perf_counter() - began) / rounds}
    finally:
        if hr.is_initialized():
            hr.destroy()
        dist.destroy_process_group()


def main(argv: Sequence[str]) -> int:
    rank, world, store, device, nbytes, rounds, timeout_s = argv
    try:
        got = _rank_main(int(rank), int(world), store, device, int(nbytes), int(rounds), float(timeout_s))
    except Exception as e:  # the step's failure, said in its result
        got = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps({"rank": int(rank), **got}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
