"""Scheduling throughput of the spine on a real local cluster, against Slurm's measured figure.

Submits N one-node `true` jobs at once to a local cluster of 3 nodes (real nats-server,
controller and agents as processes, the `hfai local` windows) and prints, in one run:
  * jobs/s from the first submit to the last job finished, and the ratio against Slurm's
    2.4 jobs/s measured on the same kind of machine (docs/performance.md);
  * KV writes per job: revisions added to the jobs bucket and to the assignments bucket while
    the batch ran (every revision is one JetStream write, replicated on a real cluster).

Once per launcher kind ([agent] launcher: forked from a zygote, or exec'd) and container ([agent]
container: bwrap, or none), with their ratios.

    python bench/bench_throughput.py [--jobs 500] [--nodes 3] [--launchers fork,exec] [--containers bwrap,none]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hfai.api.client import ApiClient
from hfai.auth.roles import Role
from hfai.cli.local import LocalCluster
from hfai.cli.local.layout import LOCAL_AGENT
from hfai.core import nats as _nats
from hfai.core.config import Config
from hfai.protocol import names
from hfai.protocol.types import ChainState, JobRecord, JobSpec

SLURM_JOBS_PER_S = 2.4


async def kv_revisions(config: Config, creds: str) -> dict[str, int]:
    """Revisions ever written to the jobs and assignments buckets (their streams' last sequence);
    read with a controller's credentials (users may not touch JetStream)."""
    nc = await _nats.connect(config, name="bench-throughput", reconnect=False, creds=creds)
    try:
        js = nc.jetstream()
        out = {}
        for bucket in (names.BUCKET_JOBS, names.BUCKET_ASSIGN):
            out[bucket] = (await js.stream_info(f"KV_{bucket}")).state.last_seq
        return out
    finally:
        await nc.close()


async def run_batch(config: Config, n: int, workdir: str, timeout_s: float) -> tuple[float, list[JobRecord]]:
    """Submit ``n`` `true` jobs, wait until every one finished. Returns the seconds from the first
    submit to the last end, and the final records."""
    async with ApiClient(config, user="bench") as api:
        t0 = time.monotonic()
        ids = [(await api.submit(JobSpec(name=f"t{i}", entrypoint=("true",), workdir=workdir, nodes=1))).id
               for i in range(n)]
        deadline = t0 + timeout_s
        done: list[JobRecord] = []
        # Wait for each in submit order (FIFO): one cheap status call per poll, so the poller
        # takes little of the CPU the cluster under test needs.
        for job_id in ids:
            while not (j := await api.status(job_id)).state.final:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{n - len(done)} of {n} jobs not finished after {timeout_s:g}s")
                await asyncio.sleep(0.2)
            if j.state is not ChainState.SUCCEEDED:
                raise RuntimeError(f"job {j.id} ended {j.state.value}: {j.reason}")
            done.append(j)
        took = time.monotonic() - t0
        return took, done


def host_busy_s() -> float:
    """Busy CPU seconds of the whole host since boot, from /proc/stat: the batch's cost
    in CPU, which throughput on 2 shared cores depends on, read without instrumenting any process
    (the launchers and jobs are reaped by the kernel, so no parent's rusage has them)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz


def breakdown(jobs: list[JobRecord]) -> tuple[float, float]:
    """Medians of (start decided -> exit recorded: the agent's round trip) and (a node's exit
    recorded -> the leader's next start decision on that node: the leader's reaction)."""
    runs, gaps = [], []
    by_node: dict[str, list[JobRecord]] = {}
    for j in jobs:
        runs.append(j.ended_ts - j.started_ts)
        by_node.setdefault(j.last_nodes[0], []).append(j)
    for seq in by_node.values():
        seq.sort(key=lambda j: j.started_ts)
        gaps += [b.started_ts - a.ended_ts for a, b in itertools.pairwise(seq)]
    return statistics.median(runs), statistics.median(gaps) if gaps else 0.0


def measure(args, launcher: str, container: str) -> tuple[float, list[JobRecord], dict[str, int], dict[str, int],
                                                           float]:
    """One batch on a fresh cluster whose agents start launchers the way ``launcher`` says and
    run jobs in ``container`` ("bwrap" or "none": bare processes, without cgroups either); also
    the host's busy CPU seconds while the batch ran."""
    with tempfile.TemporaryDirectory(prefix="hfai-bench-tp-") as tmp:
        if args.keep:
            tmp = f"{args.keep}/{launcher}-{container}"
        # Jobs run as the agent's own account: "bench" has no Unix account here.
        agent = dataclasses.replace(LOCAL_AGENT, run_as="agent", launcher=launcher, container=container,
                                    cgroups=container != "none")
        cluster = LocalCluster(root=Path(tmp), nodes=args.nodes, agent=agent)
        try:
            cluster.up()
            cluster.wait_ready()
            config = cluster.config()
            cluster.user_creds("bench")
            creds = str(cluster.service_creds("controller-0", Role.CONTROLLER))
            before = asyncio.run(kv_revisions(config, creds))
            busy0 = host_busy_s()
            took, jobs = asyncio.run(run_batch(config, args.jobs, tmp, args.timeout))
            busy = host_busy_s() - busy0
            after = asyncio.run(kv_revisions(config, creds))
        finally:
            cluster.down()
    return took, jobs, before, after, busy


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--launchers", default="fork,exec",
                   help="[agent] launcher of each run, in order: fork (zygote) and/or exec (one interpreter per run)")
    p.add_argument("--containers", default="bwrap",
                   help="[agent] container of each run, in order: bwrap (a compute container and cgroup per run) "
                        "and/or none (bare processes); with both, their ratio")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--keep", help="run the clusters under this directory and keep them (logs) afterwards")
    args = p.parse_args(argv)
    rates = {}
    for launcher, container in itertools.product(args.launchers.split(","), args.containers.split(",")):
        load_before = os.getloadavg()[0]
        took, jobs, before, after, busy = measure(args, launcher, container)
        rate = rates[launcher, container] = args.jobs / took
        jobs_w = (after[names.BUCKET_JOBS] - before[names.BUCKET_JOBS]) / args.jobs
        assign_w = (after[names.BUCKET_ASSIGN] - before[names.BUCKET_ASSIGN]) / args.jobs
        # The host's other work takes cores from the cluster under test: say how busy it was.
        print(f"{args.jobs} one-node `true` jobs on {args.nodes} nodes, launchers by {launcher}, container "
              f"{container}: {took:.1f} s "
              f"(load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after)")
        print(f"  throughput          {rate:8.2f} jobs/s   (Slurm {SLURM_JOBS_PER_S} jobs/s: "
              f"{rate / SLURM_JOBS_PER_S:.2f}x)")
        print(f"  KV writes per job   {jobs_w:8.2f} job records + {assign_w:.2f} assignments")
        print(f"  host CPU per job    {busy / args.jobs * 1000:8.1f} ms   ({busy:.1f} of {took * os.cpu_count():.1f} "
              f"core-seconds busy while the batch ran, whatever ran)")
        agent_s, leader_s = breakdown(jobs)
        print(f"  per job (medians)   {agent_s * 1000:8.0f} ms start decided -> exit recorded, "
              f"{leader_s * 1000:.0f} ms exit recorded -> next start on the node", flush=True)
    first = args.containers.split(",")[0]
    if {("fork", first), ("exec", first)} <= rates.keys():
        print(f"fork vs exec launchers, same run: {rates['fork', first]:.2f} / {rates['exec', first]:.2f} jobs/s = "
              f"{rates['fork', first] / rates['exec', first]:.2f}x")
    for launcher in args.launchers.split(","):
        if {(launcher, "bwrap"), (launcher, "none")} <= rates.keys():
            print(f"containers vs bare processes ({launcher}), same run: {rates[launcher, 'bwrap']:.2f} / "
                  f"{rates[launcher, 'none']:.2f} jobs/s = {rates[launcher, 'bwrap'] / rates[launcher, 'none']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
