"""Scheduling throughput of the spine on a real local cluster, against Slurm's measured figure.

Submits N one-node `true` jobs at once to a local cluster of 3 nodes (real nats-server,
controller and agents as processes, the `hfai local` windows) and prints, in one run:
  * jobs/s from the first submit to the last job finished, and the ratio against Slurm's
    2.4 jobs/s measured on the same kind of machine (docs/performance.md);
  * KV writes per job: revisions added to the jobs bucket and to the assignments bucket while
    the batch ran (every revision is one JetStream write, replicated on a real cluster);
  * CPU per job: the cluster's own processes' (nats-server, controller, agents, zygotes,
    launchers, containers, jobs: a cpuacct cgroup they are born in, where the host has cgroup v1),
    and the whole host's busy CPU (which includes the kernel workers that tear down containers'
    namespaces, and whatever else ran).

Once per launcher kind ([agent] launcher: forked from a zygote, or exec'd) and container ([agent]
container: bwrap, or none), with their ratios.

    python bench/bench_throughput.py [--jobs 500] [--nodes 3] [--launchers fork,exec] [--containers bwrap,none]
                                     [--rounds 3]
"""

from __future__ import annotations

import argparse
import array
import asyncio
import dataclasses
import fcntl
import itertools
import os
import shutil
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
    submit to the last job's end (as the leader recorded it), and the final records."""
    async with ApiClient(config, user="bench") as api:
        t0, t0_wall = time.monotonic(), time.time()
        ids = [(await api.submit(JobSpec(name=f"t{i}", entrypoint=("true",), workdir=workdir, nodes=1))).id
               for i in range(n)]
        deadline = t0 + timeout_s
        # Wait for the last one submitted (jobs start in submit order), then list them all: a few
        # cheap calls in all, so that the poller takes little of the CPU the cluster under test
        # needs (a status call per job was about a millisecond of CPU per job between the bench,
        # nats-server and the controller).
        wanted = set(ids)
        while True:
            if (await api.status(ids[-1])).state.final:
                jobs = [j for j in await api.list(all_users=False, include_finished=True) if j.id in wanted]
                if len(jobs) == n and all(j.state.final for j in jobs):
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"not all of {n} jobs finished after {timeout_s:g}s")
            await asyncio.sleep(0.2)
        for j in jobs:
            if j.state is not ChainState.SUCCEEDED:
                raise RuntimeError(f"job {j.id} ended {j.state.value}: {j.reason}")
        return max(j.ended_ts for j in jobs) - t0_wall, jobs


def host_busy_s() -> float:
    """Busy CPU seconds of the whole host since boot, from /proc/stat: the batch's cost
    in CPU, which throughput on 2 shared cores depends on, read without instrumenting any process
    (the launchers and jobs are reaped by the kernel, so no parent's rusage has them)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle, iowait
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(ticks) - idle) / hz


CPUACCT = "/sys/fs/cgroup/cpuacct"


class ClusterCpu:
    """The CPU time of a cluster's process tree, however its processes end: a cpuacct cgroup (v1)
    that the bench joins while the cluster starts, so that every daemon, and every process they
    start, is born in it (the launchers and jobs are reaped by the kernel, so no rusage has
    them). Kernel workers are in none; the host's /proc/stat line has them. Where the host has no
    writable cpuacct hierarchy, :meth:`read` says None."""

    def __init__(self, name: str):
        self.dir = os.path.join(CPUACCT, name)
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError:
            self.dir = ""

    def __enter__(self) -> ClusterCpu:
        self._home = _own_cpuacct()
        if self.dir and self._home is not None:
            self._write(self.dir, os.getpid())
        return self

    def __exit__(self, *exc) -> None:
        if self.dir and self._home is not None:
            self._write(self._home, os.getpid())  # back out: the bench's own polling is not the cluster's

    @staticmethod
    def _write(d: str, pid: int) -> None:
        try:
            with open(os.path.join(d, "cgroup.procs"), "w") as f:
                f.write(f"{pid}\n")
        except OSError:
            pass

    def read(self) -> tuple[float, float] | None:
        """CPU seconds of the cluster's processes so far, and of those in the kernel; None if not
        measured."""
        try:
            with open(os.path.join(self.dir, "cpuacct.usage")) as f:
                total = int(f.read()) / 1e9
            with open(os.path.join(self.dir, "cpuacct.stat")) as f:
                ticks = dict(line.split() for line in f)
        except (OSError, ValueError):
            return None
        user, system = int(ticks.get("user", 0)), int(ticks.get("system", 0))
        return total, total * system / (user + system) if user + system else 0.0

    def remove(self) -> None:
        if self.dir:
            try:
                os.rmdir(self.dir)
            except OSError:
                pass


def _own_cpuacct() -> str | None:
    """This process's cpuacct cgroup folder, None if it has none."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if "cpuacct" in ctrls.split(","):
                return CPUACCT + path.rstrip("/")
    return None


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


@dataclasses.dataclass
class Batch:
    took: float
    jobs: list[JobRecord]
    before: dict[str, int]
    after: dict[str, int]
    host_busy_s: float  # the whole host's busy CPU while the batch ran
    cluster_s: tuple[float, float] | None  # the cluster's processes' CPU, and its kernel part (None: not measured)


# ext4's FS_IOC_GETFLAGS / FS_IOC_SETFLAGS and its "top of a directory hierarchy" flag (chattr +T).
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_TOPDIR_FL = 0x80086601, 0x40086602, 0x00020000


def batches_folder(keep: str | None) -> str:
    """The folder the batches' clusters are made in, one each (all deleted at the bench's end).

    Marked as the top of a hierarchy (chattr +T) where the filesystem has the flag: ext4 then
    places each folder made in it, a batch's cluster, in a block group of its own choosing (the
    Orlov allocator's spread, as for folders made in /), rather than next to its parent. On ext4
    without a journal a new inode steps over every inode of its group freed in the last five
    minutes (docs/performance.md): an earlier batch's cluster, deleted next to the new one, would
    tax every file the new batch makes, and the figure would say how recently the bench last ran."""
    base = keep or tempfile.mkdtemp(prefix="hfai-bench-tp-")
    os.makedirs(base, exist_ok=True)
    try:
        fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
        try:
            flags = array.array("l", [0])
            fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
            flags[0] |= _FS_TOPDIR_FL
            fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags, True)
        finally:
            os.close(fd)
    except OSError:
        pass  # another filesystem, or not allowed: the clusters lie next to each other
    return base


def measure(args, launcher: str, container: str, folder: str) -> Batch:
    """One batch on a fresh cluster (in ``folder``) whose agents start launchers the way
    ``launcher`` says and run jobs in ``container`` ("bwrap" or "none": bare processes, without
    cgroups either); also the CPU seconds it took."""
    tmp = tempfile.mkdtemp(prefix=f"{launcher}-{container}-", dir=folder)
    # Jobs run as the agent's own account: "bench" has no Unix account here.
    agent = dataclasses.replace(LOCAL_AGENT, run_as="agent", launcher=launcher, container=container,
                                cgroups=container != "none")
    cluster = LocalCluster(root=Path(tmp), nodes=args.nodes, agent=agent)
    cpu = ClusterCpu(f"hfai-bench-{os.getpid()}-{launcher}-{container}")
    try:
        with cpu:
            cluster.up()
        cluster.wait_ready()
        config = cluster.config()
        cluster.user_creds("bench")
        creds = str(cluster.service_creds("controller-0", Role.CONTROLLER))
        before = asyncio.run(kv_revisions(config, creds))
        busy0, cpu0 = host_busy_s(), cpu.read()
        took, jobs = asyncio.run(run_batch(config, args.jobs, tmp, args.timeout))
        busy, cpu1 = host_busy_s() - busy0, cpu.read()
        after = asyncio.run(kv_revisions(config, creds))
    finally:
        cluster.down()
        cpu.remove()
    spent = (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]) if cpu0 is not None and cpu1 is not None else None
    return Batch(took, jobs, before, after, busy, spent)


def report(args, launcher: str, container: str, b: Batch, load_before: float) -> float:
    """Print one batch's figures; returns its jobs/s."""
    took, jobs, before, after, busy = b.took, b.jobs, b.before, b.after, b.host_busy_s
    rate = args.jobs / took
    jobs_w = (after[names.BUCKET_JOBS] - before[names.BUCKET_JOBS]) / args.jobs
    assign_w = (after[names.BUCKET_ASSIGN] - before[names.BUCKET_ASSIGN]) / args.jobs
    # The host's other work takes cores from the cluster under test: say how busy it was.
    print(f"{args.jobs} one-node `true` jobs on {args.nodes} nodes, launchers by {launcher}, container "
          f"{container}: {took:.1f} s "
          f"(load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after)")
    print(f"  throughput          {rate:8.2f} jobs/s   (Slurm {SLURM_JOBS_PER_S} jobs/s: "
          f"{rate / SLURM_JOBS_PER_S:.2f}x)")
    print(f"  KV writes per job   {jobs_w:8.2f} job records + {assign_w:.2f} assignments")
    if b.cluster_s is not None:
        total_s, kernel_s = b.cluster_s
        print(f"  cluster CPU per job {total_s / args.jobs * 1000:8.1f} ms   ({kernel_s / args.jobs * 1000:.1f} ms "
              "in the kernel; its processes' own: nats-server, controller, agents, launchers, containers, jobs)")
    print(f"  host CPU per job    {busy / args.jobs * 1000:8.1f} ms   ({busy:.1f} of {took * os.cpu_count():.1f} "
          f"core-seconds busy while the batch ran, whatever ran)")
    agent_s, leader_s = breakdown(jobs)
    print(f"  per job (medians)   {agent_s * 1000:8.0f} ms start decided -> exit recorded, "
          f"{leader_s * 1000:.0f} ms exit recorded -> next start on the node", flush=True)
    return rate


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=500)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--launchers", default="fork,exec",
                   help="[agent] launcher of each run, in order: fork (zygote) and/or exec (one interpreter per run)")
    p.add_argument("--containers", default="bwrap",
                   help="[agent] container of each run, in order: bwrap (a compute container and cgroup per run) "
                        "and/or none (bare processes); with both, their ratio")
    p.add_argument("--rounds", type=int, default=3,
                   help="batches of each kind, taking turns; the figures compared are their medians")
    p.add_argument("--timeout", type=float, default=1800.0)
    p.add_argument("--keep", help="run the clusters under this directory and keep them (logs) afterwards")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.jobs < 1:
        p.error("--rounds and --jobs must be at least 1")
    kinds = list(itertools.product(args.launchers.split(","), args.containers.split(",")))
    rates: dict[tuple[str, str], list[float]] = {k: [] for k in kinds}
    folder = batches_folder(args.keep)
    try:
        for n in range(args.rounds):
            for launcher, container in kinds:
                if args.rounds > 1:
                    print(f"[round {n + 1} of {args.rounds}]", end=" ")
                load_before = os.getloadavg()[0]
                b = measure(args, launcher, container, folder)
                rates[launcher, container].append(report(args, launcher, container, b, load_before))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)  # after the last batch: see batches_folder
    rate = {k: statistics.median(v) for k, v in rates.items()}
    if args.rounds > 1:
        for (launcher, container), v in rates.items():
            print(f"median of {args.rounds} batches, launchers by {launcher}, container {container}: "
                  f"{rate[launcher, container]:.2f} jobs/s (each: {', '.join(f'{r:.2f}' for r in v)})")
    first = args.containers.split(",")[0]
    if {("fork", first), ("exec", first)} <= rate.keys():
        print(f"fork vs exec launchers, same run: {rate['fork', first]:.2f} / {rate['exec', first]:.2f} jobs/s = "
              f"{rate['fork', first] / rate['exec', first]:.2f}x")
    for launcher in args.launchers.split(","):
        if {(launcher, "bwrap"), (launcher, "none")} <= rate.keys():
            print(f"containers vs bare processes ({launcher}), same run: {rate[launcher, 'bwrap']:.2f} / "
                  f"{rate[launcher, 'none']:.2f} jobs/s = {rate[launcher, 'bwrap'] / rate[launcher, 'none']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
