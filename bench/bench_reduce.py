"""Benchmark hfai.reduce against torch.distributed gloo all_reduce on one machine.

Prints, for 2 and 4 local ranks and 1/16/64/256 MiB fp32 tensors, the median time of
  gloo      torch.distributed.all_reduce (gloo backend), the peer we measure against
  ours      hfai.reduce allreduce(tensor): copy into shared memory, sum, copy out
  resident  hfai.reduce allreduce_shared(): the buffer already lives in shared memory (how
            DistributedDataParallel keeps its gradient buckets)
as algorithm bandwidth (tensor bytes / time) and as a ratio to gloo; and the effective memory
bandwidth of ours as a fraction of np.add's, measured in the same run:
  np.add bandwidth  = 3 * S / t(np.add of two S-byte arrays into a third), one core
  effective         = 2 * N * S / t: an ideal N-rank all-reduce reads every input once and writes
                      every output once; this is the traffic no implementation can avoid.
Each rank uses one intra-op thread (as torchrun sets OMP_NUM_THREADS=1). Run: python bench/bench_reduce.py
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

MiB = 1 << 20
SIZES_MIB = (1, 16, 64, 256)
RANKS = (2, 4)
TIMEOUT_S = 120.0


def repeats(size_mib: int) -> int:
    return {1: 30, 16: 8, 64: 5, 256: 3}[size_mib]


def np_add_bandwidth(nbytes: int = 64 * MiB, reps: int = 7) -> float:
    a = np.ones(nbytes // 4, dtype=np.float32)
    b = np.ones_like(a)
    out = np.empty_like(a)
    np.add(a, b, out=out)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.add(a, b, out=out)
        times.append(time.perf_counter() - t0)
    return 3 * nbytes / statistics.median(times)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def timed(fn, reps: int, reset) -> float:
    """Median over ``reps`` of the slowest rank's time (each rank starts after a barrier).

    ``reset`` refills the input outside the timed region, so repeated sums cannot overflow.
    """
    fn()  # warm-up: first touch of buffers, connection setup
    times = []
    for _ in range(reps):
        reset()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        times.append(dt.item())
    return statistics.median(times)


def worker(rank: int, world: int, port: int, queue) -> None:
    import hfai.reduce as R

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    cap = max(SIZES_MIB) * MiB
    group = R.ReduceGroup.create(config=R.ReduceConfig(timeout_s=TIMEOUT_S, capacity_bytes=cap))
    shared = group.shared_buffer().view(torch.float32)
    rows = []
    for size in SIZES_MIB:
        n = size * MiB // 4
        x = torch.ones(n)
        reps = repeats(size)
        view = shared[:n]
        t_gloo = timed(lambda x=x: dist.all_reduce(x), reps, lambda x=x: x.fill_(1.0))
        t_ours = timed(lambda x=x: group.allreduce(x), reps, lambda x=x: x.fill_(1.0))
        t_res = timed(lambda view=view: group.allreduce_shared(view), reps, lambda view=view: view.fill_(1.0))
        rows.append((size, t_gloo, t_ours, t_res))
    group.close()
    dist.destroy_process_group()
    if rank == 0:
        queue.put(rows)


def run(world: int) -> list[tuple]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return queue.get(timeout=600)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def main() -> int:
    add_bw = np_add_bandwidth()
    print(f"np.add bandwidth (64 MiB fp32, one core): {add_bw / 1e9:.1f} GB/s  "
          f"[cores: {os.cpu_count()}]")
    for world in RANKS:
        rows = run(world)
        add_after = np_add_bandwidth()
        print(f"\n{world} local ranks  (np.add re-measured after: {add_after / 1e9:.1f} GB/s)")
        print(f"{'size':>8} {'gloo GB/s':>10} {'ours GB/s':>10} {'ratio':>7} "
              f"{'resident GB/s':>14} {'ratio':>7} {'ours eff/np.add':>16} {'resident eff/np.add':>20}")
        for size, t_gloo, t_ours, t_res in rows:
            s = size * MiB
            bw = lambda t, s=s: s / t / 1e9  # noqa: E731
            eff = lambda t, s=s, world=world: 2 * world * s / t / add_bw  # noqa: E731
            print(f"{size:>5}MiB {bw(t_gloo):>10.2f} {bw(t_ours):>10.2f} {t_gloo / t_ours:>6.2f}x "
                  f"{bw(t_res):>14.2f} {t_gloo / t_res:>6.2f}x {eff(t_ours):>15.0%} {eff(t_res):>19.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
