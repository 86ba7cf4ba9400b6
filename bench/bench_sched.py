"""Scheduler benchmark: one policy decision at cluster scale, a full trace replay, and the policy
table (hfai against FIFO and LAS measured in the same run).

    .venv/bin/python bench/bench_sched.py [--jobs 80000] [--table-jobs 20000] [--reps 15]

Prints figures only; nothing here is a timed assertion (DESIGN: benchmarks live in bench/).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hfai.controller import sim, tracegen
from hfai.controller.policy import JobView, NodeView, PolicyConfig, decide
from hfai.protocol.types import ChainState, Priority

NODES = 1250
PRIOS = [Priority.LOW, Priority.NORMAL, Priority.NORMAL, Priority.NORMAL, Priority.ABOVE_NORMAL, Priority.HIGH]


def cluster_snapshot(n_nodes: int, queued: int, running: int, seed: int = 0) -> tuple[list[JobView], list[NodeView]]:
    """A full cluster: ``running`` jobs on every node, ``queued`` more waiting, mixed sizes,
    priorities and users, a third of the running jobs past their time slice."""
    rng = random.Random(seed)
    nodes = [NodeView(f"n{i:05d}") for i in range(n_nodes)]
    sizes = [1] * running
    for _ in range(n_nodes - running):  # spread the remaining nodes over some jobs
        sizes[rng.randrange(running)] += 1
    jobs: list[JobView] = []
    k = 0
    for i, size in enumerate(sizes):
        held = tuple(nodes[k + m].name for m in range(size))
        k += size
        jobs.append(JobView(f"r{i:05d}", f"u{rng.randrange(20)}", int(rng.choice(PRIOS)), size, rng.uniform(0, 5e4),
                            ChainState.RUNNING, held=held, started_ts=rng.uniform(5e4, 1e5)))
    for i in range(queued):
        state = ChainState.QUEUED if rng.random() < 0.7 else ChainState.SUSPENDED
        jobs.append(JobView(f"q{i:05d}", f"u{rng.randrange(20)}", int(rng.choice(PRIOS)),
                            rng.choice([1, 1, 1, 2, 4, 8, 16, 64]), rng.uniform(0, 1e5), state,
                            slice_turns=rng.randrange(3) if state is ChainState.SUSPENDED else 0))
    rng.shuffle(jobs)
    return jobs, nodes


def bench_decision(reps: int) -> None:
    jobs, nodes = cluster_snapshot(NODES, 5000, 1000)
    config = PolicyConfig()  # the live configuration: every waiting job gets its reason
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = decide(jobs, nodes, 1e5, config)
        times.append(time.perf_counter() - t0)
    print(f"one decision, {NODES} nodes x (5000 queued + 1000 running): median {1e3 * statistics.median(times):.1f} ms"
          f" (min {1e3 * min(times):.1f}, max {1e3 * max(times):.1f}, {reps} reps, {len(out)} decisions)")
    print(f"  target 50 ms: median/target = {statistics.median(times) / 0.05:.2f}")


def bench_replay(n_jobs: int, load: float) -> None:
    trace = tracegen.generate(n_jobs, NODES, load=load, seed=7)
    t0 = time.perf_counter()
    r = sim.simulate(trace, NODES, "hfai")
    wall = time.perf_counter() - t0
    print(f"full replay: {n_jobs} jobs on {NODES} nodes (offered load {tracegen.offered_load(trace, NODES):.2f}), "
          f"hfai policy: {wall:.1f} s wall, {r.decisions} policy calls, {r.makespan_s / 86400:.1f} virtual days")
    print(f"  target 120 s: wall/target = {wall / 120:.2f}")


def bench_table(n_jobs: int, n_nodes: int, load: float) -> None:
    trace = tracegen.generate(n_jobs, n_nodes, load=load, seed=11)
    print(f"policy table: {n_jobs} jobs on {n_nodes} nodes over {trace[-1].submit_s / 86400:.1f} days, offered load "
          f"{tracegen.offered_load(trace, n_nodes):.2f}, checkpoint 60 s, restart 60 s, slice 30 min")
    results = []
    for name in ("hfai", "fifo", "las"):
        t0 = time.perf_counter()
        results.append(sim.simulate(trace, n_nodes, name))
        print(f"  {name}: replayed in {time.perf_counter() - t0:.1f} s")
    print(sim.format_table(results))
    by = {r.policy: r for r in results}
    hfai = by["hfai"]
    print(f"avg JCT fifo/hfai = {by['fifo'].avg_jct_s / hfai.avg_jct_s:.1f}x  (target >= 2x)")
    print(f"avg JCT las/hfai = {by['las'].avg_jct_s / hfai.avg_jct_s:.2f}x")
    print(f"utilisation while work waits: hfai {100 * hfai.utilisation:.1f}% (target >= 95%), "
          f"hfai/fifo = {hfai.utilisation / by['fifo'].utilisation:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=80_000, help="jobs in the full replay")
    ap.add_argument("--replay-load", type=float, default=0.8,
                    help="offered load of the full replay (above 1 its queue, and so each decision, keeps growing)")
    ap.add_argument("--table-jobs", type=int, default=8_000, help="jobs in the policy table's trace")
    ap.add_argument("--table-nodes", type=int, default=250,
                    help="cluster of the policy table (smaller: weeks of overload replay in seconds)")
    ap.add_argument("--load", type=float, default=1.2, help="offered load of the policy table's trace")
    ap.add_argument("--reps", type=int, default=15, help="repetitions of the one-decision timing")
    args = ap.parse_args()
    bench_decision(args.reps)
    bench_replay(args.jobs, args.replay_load)
    bench_table(args.table_jobs, args.table_nodes, args.load)


if __name__ == "__main__":
    main()
