"""A job with spawned workers that acknowledges a suspend and exits 0 (issue 13, defect 11).

Each worker waits for the suspend flag and saves its share of a checkpoint; rank 0 is quick and
acknowledges at once, rank 1's share takes SLOW_SHARE_S longer (a bigger share), so the parent's
exit comes seconds after the first ack, as it does for real jobs whose ranks finish at different
times. ``python spawn_suspend.py OUT_DIR``."""

import os
import sys
import time

import hfai
import hfai.multiprocessing

SLOW_SHARE_S = 2.5


def worker(rank: int, out: str) -> None:
    print(f"worker {rank} up", flush=True)
    while not hfai.receive_suspend_command():
        time.sleep(0.05)
    if rank:
        time.sleep(SLOW_SHARE_S)
    with open(os.path.join(out, f"share{rank}"), "w") as f:
        f.write(str(rank))
    print(f"worker {rank} saved its share", flush=True)
    hfai.go_suspend()


if __name__ == "__main__":
    hfai.multiprocessing.spawn(worker, args=(sys.argv[1],), nprocs=2)
    print("parent: all workers done", flush=True)
