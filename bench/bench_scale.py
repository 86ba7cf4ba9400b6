"""Scale of the spine on simulated nodes: trivial-job throughput on 3 and 100 nodes beside Slurm's
figure, and a 1,000-node cluster's heartbeat, scheduling and `hfai nodes` latencies.

Every cluster is real (nats-server with authentication, a controller, as in `hfai local`); its
agents are real agents hosted by fleet processes (hfai.agent.fleet: many agents on one event
loop, each with its own node name, state, credentials and NATS connection, simulated GPUs).

  1. Throughput: N one-node `true` jobs submitted at once on 3 and on 100 nodes (one fleet
     process, the `hfai local` windows); jobs/s from the first submit to the last end, and KV
     writes per job (bench_throughput.py's measurement, imported), against Slurm's 2.4 jobs/s
     measured on this machine (docs/performance.md).
  2. 1,000 nodes in a few fleet processes with production heartbeats (5 s, timeout 30 s), on a
     nats-server whose per-stream consumer cap is lifted (see NO_CONSUMER_CAP; --stock-nats keeps
     it, to show what it does):
     * how many agents hold their assignment watch (a consumer on hfai_assign each);
     * heartbeat latency, from the agent's stamp (NodeRecord.ts) to (a) a KV watcher in this
       process having the update, (b) the controller having it (derived from the ages `hfai
       nodes` reports, to within half a reply's round trip); and the spread of those ages;
     * `hfai nodes`: the client's nodes() call (every page), and the whole CLI process, one run
       after another and a heartbeat interval apart (every record new to the controller);
     * scheduling: submit -> placed for single jobs (one round: node check, the policy over all
       nodes, the start written), and a burst of one-node jobs submitted at once;
     * the idle CPU of nats-server, the controller and the fleets.

    python bench/bench_scale.py [--jobs 200] [--small 3,100] [--big 1000 --fleets 2] [--hb 5]

On 2 cores the whole run takes a few minutes; every part has an option to make it smaller.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import math
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats.errors
import psutil
from bench_throughput import SLURM_JOBS_PER_S, breakdown, kv_revisions, run_batch

from hfai.agent import fleet
from hfai.api.client import ApiClient
from hfai.auth.roles import Role
from hfai.cli.local import LocalCluster
from hfai.cli.local.layout import LOCAL_AGENT, LOCAL_CONTROLLER
from hfai.cli.local.nats_server import start_nats
from hfai.core import nats as _nats
from hfai.core.config import AgentConfig, Config, ControllerConfig
from hfai.protocol import decode, names, verbs
from hfai.protocol.types import ChainState, JobRecord, JobSpec, NodeRecord, NodesRequest, NodeState

USER = "bench"  # submits as a plain user; it has no Unix account here, so jobs run as the agents' account

#: nats-server 2.15 caps every stream at 1,000 consumers unless its configuration lifts the cap
#: (a stream's max_consumers = -1 does not lift it), and every agent holds one consumer
#: on hfai_assign, its assignment watch: from about 1,000 nodes on, agents are left without one
#: (they log "maximum consumers limit reached" and never learn their assignment).
NO_CONSUMER_CAP = "\njetstream { limits { default_max_consumers: -1 } }\n"


# ------------------------------------------------------------------------------- the cluster

@dataclasses.dataclass
class FleetCluster:
    """A local cluster without agent processes of its own, plus fleet processes hosting ``nodes``."""

    cluster: LocalCluster
    nats: subprocess.Popen | None  # our own nats-server (consumer cap lifted), else the cluster's
    nodes: int
    fleets: list[subprocess.Popen]
    creds_s: float  # issuing the agents' credentials
    up_s: float  # from starting the fleets to every node UP in `hfai nodes`

    @property
    def config(self) -> Config:
        return self.cluster.config()

    def service_creds(self) -> str:
        return str(self.cluster.service_creds("controller-0", Role.CONTROLLER))

    def pids(self) -> dict[str, int]:
        nats_pid = self.nats.pid if self.nats is not None else self.cluster.pids["nats"]
        out = {"nats-server": nats_pid, "controller": self.cluster.pids["controller-0"]}
        out.update({f"fleet-{k}": p.pid for k, p in enumerate(self.fleets)})
        return out


def start_cluster(cluster: LocalCluster, lift_cap: bool) -> subprocess.Popen | None:
    """Start ``cluster`` (no agents); with ``lift_cap``, on a nats-server of our own like its own
    but without the per-stream consumer cap (returned: the caller stops it after the cluster)."""
    if not lift_cap:
        cluster.up()
        return None
    cluster.root.mkdir(parents=True, exist_ok=True)
    conf = cluster.root / "nats-bench.conf"
    conf.write_text(cluster.server_auth_config(cluster.root / "nats" / "accounts") + NO_CONSUMER_CAP)
    proc, url = start_nats(cluster.root / "nats", cluster.root / "logs" / "nats.log", config_file=conf)
    try:
        cluster.up(url)
    except BaseException:
        proc.terminate()
        proc.wait()
        raise
    return proc


@contextlib.contextmanager
def fleet_cluster(root: Path, nodes: int, fleets: int, agent: AgentConfig, controller: ControllerConfig,
                  up_timeout_s: float, lift_cap: bool = False):
    cluster = LocalCluster(root=root, nodes=0, controller=controller, agent=agent)
    procs: list[subprocess.Popen] = []
    nats_proc = None
    try:
        nats_proc = start_cluster(cluster, lift_cap)
        cluster.wait_ready()
        cluster.user_creds(USER)
        t = time.monotonic()
        for i in range(nodes):
            cluster.service_creds(cluster.node_name(i), Role.AGENT)
        creds_s = time.monotonic() - t
        t = time.monotonic()
        per = math.ceil(nodes / fleets)
        for k, first in enumerate(range(0, nodes, per)):
            procs.append(fleet.spawn(cluster.config_path, min(per, nodes - first), first, root / "agents",
                                     root / "auth" / "creds", root / "logs" / f"fleet-{k}.log"))
        asyncio.run(wait_all_up(cluster.config(), nodes, procs, up_timeout_s))
        yield FleetCluster(cluster, nats_proc, nodes, procs, creds_s, time.monotonic() - t)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        cluster.down()
        if nats_proc is not None:
            nats_proc.terminate()
            nats_proc.wait(10)


async def wait_all_up(config: Config, nodes: int, procs: list[subprocess.Popen], timeout_s: float) -> None:
    async with ApiClient(config, user=USER) as api:
        deadline = time.monotonic() + timeout_s
        up = 0
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                raise RuntimeError("a fleet process ended while starting; see its log under logs/")
            up = sum(i.state is NodeState.UP for i in await api.nodes())
            if up >= nodes:
                return
            await asyncio.sleep(1.0)
    raise TimeoutError(f"only {up} of {nodes} nodes up after {timeout_s:g}s")


# ------------------------------------------------------------------------------ throughput

@dataclasses.dataclass
class Throughput:
    nodes: int
    jobs: int
    seconds: float
    record_writes: float
    assign_writes: float
    agent_s: float
    leader_s: float

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds


def throughput(root: Path, nodes: int, jobs: int, timeout_s: float) -> Throughput:
    agent = dataclasses.replace(LOCAL_AGENT, run_as="agent")
    with fleet_cluster(root, nodes, 1, agent, LOCAL_CONTROLLER, up_timeout_s=120.0) as fc:
        creds = fc.service_creds()
        before = asyncio.run(kv_revisions(fc.config, creds))
        took, done = asyncio.run(run_batch(fc.config, jobs, str(root), timeout_s))
        after = asyncio.run(kv_revisions(fc.config, creds))
    agent_s, leader_s = breakdown(done)
    return Throughput(nodes, jobs, took,
                      (after[names.BUCKET_JOBS] - before[names.BUCKET_JOBS]) / jobs,
                      (after[names.BUCKET_ASSIGN] - before[names.BUCKET_ASSIGN]) / jobs, agent_s, leader_s)


# ------------------------------------------------------------------------------- 1,000 nodes

async def assignment_watches(config: Config, creds: str) -> int:
    """Consumers on the assignment bucket: one per agent watching its assignment."""
    nc = await _nats.connect(config, "bench-scale-consumers", reconnect=False, creds=creds)
    try:
        return (await nc.jetstream().stream_info(f"KV_{names.BUCKET_ASSIGN}")).state.consumer_count
    finally:
        await nc.close()


async def watched_heartbeats(config: Config, creds: str, window_s: float) -> list[float]:
    """Seconds from each heartbeat's stamp to this process's KV watch having it, for ``window_s``
    (the first value of each node is skipped: the watch's snapshot, not a delivery)."""
    nc = await _nats.connect(config, "bench-scale-watch", reconnect=False, creds=creds)
    try:
        kv = await nc.jetstream().key_value(names.BUCKET_NODES)
        watcher = await kv.watchall()
        seen: set[str] = set()
        delays: list[float] = []
        deadline = time.monotonic() + window_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                entry = await watcher.updates(timeout=min(left, 1.0))
            except nats.errors.TimeoutError:
                continue
            if entry is None or entry.value is None:
                continue
            if entry.key in seen:
                delays.append(time.time() - decode(entry.value, NodeRecord).ts)
            seen.add(entry.key)
        await watcher.stop()
        return delays
    finally:
        await nc.close()


async def controller_view(api: ApiClient) -> tuple[list[float], list[float], float]:
    """(stamp -> controller has it, per node, at least; the ages the controller reports; the
    longest page round trip). The controller took each age at some moment between sending the
    page's request and getting the reply: counting from the request gives a lower bound, and
    the truth is at most a round trip more."""
    seen, ages, rtt = [], [], 0.0
    req = NodesRequest()
    while True:
        t0 = time.time()
        page = await api.call(verbs.NODES, req)
        t1 = time.time()
        rtt = max(rtt, t1 - t0)
        for info in page.nodes:
            seen.append(t0 - info.age_s - info.record.ts)
            ages.append(info.age_s)
        if not (page.more and page.nodes):
            return seen, ages, rtt
        req = NodesRequest(after=page.nodes[-1].record.name)


@dataclasses.dataclass
class Runs:
    """Seconds of each run: wall clock, and CPU (user + system) of the process that ran it: on
    2 shared cores the wall clock follows the load, the CPU much less."""

    wall: list[float] = dataclasses.field(default_factory=list)
    cpu: list[float] = dataclasses.field(default_factory=list)


async def nodes_calls(api: ApiClient, calls: int, expect: int) -> Runs:
    out = Runs()
    for _ in range(calls):
        t, c = time.perf_counter(), time.process_time()
        got = await api.nodes()
        out.wall.append(time.perf_counter() - t)
        out.cpu.append(time.process_time() - c)
        if len(got) != expect:
            raise RuntimeError(f"hfai nodes showed {len(got)} nodes, not {expect}")
    return out


def children_cpu() -> float:
    """CPU seconds of this process's children that ended (the fleets and servers run on)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def cli_nodes(fc: FleetCluster, runs: int, gap_s: float = 0.0) -> Runs:
    """The whole `hfai nodes` process (interpreter start, the call, the table), each run
    ``gap_s`` after the last: with a heartbeat interval, every node's record is new to the
    controller (which keeps each record encoded while it is current)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_NATS_")}
    env.update(HFAI_CONFIG=str(fc.cluster.config_path), HFAI_USER=USER, COLUMNS="200")
    out = Runs()
    for _ in range(runs):
        time.sleep(gap_s)
        t, c = time.perf_counter(), children_cpu()
        subprocess.run([sys.executable, "-m", "hfai.cli.main", "nodes"], env=env, check=True,
                       stdout=subprocess.DEVNULL, timeout=60)
        out.wall.append(time.perf_counter() - t)
        out.cpu.append(children_cpu() - c)
    return out


def running_ts(job: JobRecord) -> float:
    return next(e.ts for e in job.history if e.state is ChainState.RUNNING)


async def probes(api: ApiClient, count: int, workdir: str) -> list[float]:
    """Submit -> placed (both on the controller's clock) for single one-node jobs, one at a time."""
    out = []
    for i in range(count):
        job = await api.submit(JobSpec(name=f"probe{i}", entrypoint=("true",), workdir=workdir, nodes=1))
        while not (job := await api.status(job.id)).state.final:
            await asyncio.sleep(0.05)
        if job.state is not ChainState.SUCCEEDED:
            raise RuntimeError(f"probe {job.id} ended {job.state.value}: {job.reason}")
        out.append(running_ts(job) - job.submit_ts)
    return out


async def burst(config: Config, count: int, workdir: str, timeout_s: float) -> tuple[float, float]:
    """``count`` one-node jobs at once on free nodes: (last submit -> all placed, first submit -> all
    ended), on the controller's clock."""
    _took, done = await run_batch(config, count, workdir, timeout_s)
    last_submit = max(j.submit_ts for j in done)
    return (max(running_ts(j) for j in done) - last_submit,
            max(j.ended_ts for j in done) - min(j.submit_ts for j in done))


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    out = {}
    for name, pid in pids.items():
        try:
            t = psutil.Process(pid).cpu_times()
            out[name] = t.user + t.system
        except psutil.Error:
            out[name] = math.nan
    return out


@dataclasses.dataclass
class BigRun:
    setup: FleetCluster
    watches: int
    watched: list[float]
    seen: list[float]
    seen_err: float
    ages: list[float]
    idle_cpu: dict[str, float]  # share of one core over the watch window
    window_s: float
    client: Runs
    cli: Runs
    cli_fresh: Runs  # each a heartbeat interval after the last
    placed: list[float]
    burst: tuple[float, float]


def big(root: Path, args) -> BigRun:
    agent = dataclasses.replace(LOCAL_AGENT, run_as="agent", heartbeat_interval_s=args.hb,
                                reconcile_interval_s=args.reconcile)
    controller = dataclasses.replace(LOCAL_CONTROLLER, heartbeat_timeout_s=args.hb_timeout)
    with fleet_cluster(root, args.big, args.fleets, agent, controller, args.up_timeout, not args.stock_nats) as fc:
        time.sleep(args.hb)  # the start-up burst passes; heartbeats spread over the interval
        watches = asyncio.run(assignment_watches(fc.config, fc.service_creds()))
        pids = fc.pids()
        cpu0, t0 = cpu_seconds(pids), time.monotonic()
        watched = asyncio.run(watched_heartbeats(fc.config, fc.service_creds(), args.window))
        cpu1, window = cpu_seconds(pids), time.monotonic() - t0
        idle = {k: (cpu1[k] - cpu0[k]) / window for k in pids}

        async def with_api():
            async with ApiClient(fc.config, user=USER) as api:
                seen, ages, err = await controller_view(api)
                client = await nodes_calls(api, args.nodes_calls, args.big)
                placed = await probes(api, args.probes, str(root))
            return seen, ages, err, client, placed

        seen, ages, err, client, placed = asyncio.run(with_api())
        cli = cli_nodes(fc, args.cli_runs)
        cli_fresh = cli_nodes(fc, args.fresh_runs, args.hb)
        burst_out = (math.nan, math.nan)
        if args.burst:
            burst_out = asyncio.run(burst(fc.config, args.burst, str(root), args.timeout))
    return BigRun(fc, watches, watched, seen, err, ages, idle, window, client, cli, cli_fresh, placed, burst_out)


# -------------------------------------------------------------------------------- printing

def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 1]); nan for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def ms_row(label: str, values: list[float], note: str = "") -> str:
    cells = " ".join(f"{pct(values, q) * 1000:9.1f}" for q in (0.5, 0.99, 1.0))
    return f"  {label:<52} {cells} {len(values):7d}  {note}"


def cpu_note(runs: Runs) -> str:
    return f"CPU p50 {pct(runs.cpu, 0.5) * 1000:.0f} ms"


def print_throughput(results: list[Throughput]) -> None:
    print("Throughput: one-node `true` jobs submitted at once; agents in one fleet process "
          f"(heartbeat {LOCAL_AGENT.heartbeat_interval_s:g} s, reconcile {LOCAL_AGENT.reconcile_interval_s:g} s)")
    print(f"  {'nodes':>5} {'jobs':>5} {'seconds':>8} {'jobs/s':>7} {'record writes/job':>18} "
          f"{'assign writes/job':>18} {'start->exit ms':>15} {'exit->next start ms':>20}")
    for r in results:
        print(f"  {r.nodes:5d} {r.jobs:5d} {r.seconds:8.1f} {r.rate:7.2f} {r.record_writes:18.2f} "
              f"{r.assign_writes:18.2f} {r.agent_s * 1000:15.0f} {r.leader_s * 1000:20.0f}")
    for r in results:
        print(f"  hfai {r.rate:.2f} jobs/s vs Slurm {SLURM_JOBS_PER_S} jobs/s: {r.rate / SLURM_JOBS_PER_S:.2f} x "
              f"({r.nodes} nodes)")


def print_big(b: BigRun, args) -> None:
    s = b.setup
    print(f"{args.big} simulated nodes: {len(s.fleets)} fleet processes, heartbeat {args.hb:g} s "
          f"(timeout {args.hb_timeout:g} s), reconcile {args.reconcile:g} s")
    print(f"  setup: agent credentials issued in {s.creds_s:.1f} s; every node UP {s.up_s:.1f} s after the "
          "fleets started; nats-server " + ("as configured by `hfai local`" if args.stock_nats
                                            else "with its per-stream consumer cap lifted"))
    print(f"  assignment watches: {b.watches} consumers on hfai_assign for {args.big} agents")
    if b.watches < args.big:
        print(f"  DEFECT: {args.big - b.watches} agents hold no assignment watch (nats-server caps a stream at "
              "1,000 consumers by default): jobs placed on their nodes never start")
    print(f"  {'':<52} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'n':>7}")
    print(ms_row("heartbeat: agent stamp -> a KV watcher has it", b.watched,
                 f"{len(b.watched) / b.window_s:.0f} heartbeats/s"))
    print(ms_row("heartbeat: agent stamp -> the controller has it", b.seen,
                 f"at least; at most {b.seen_err * 1000:.0f} ms more (a page's round trip)"))
    print(ms_row("node age in `hfai nodes`", b.ages, f"interval {args.hb:g} s; "
                 f"{sum(a > args.hb_timeout for a in b.ages)} past the timeout"))
    print(ms_row("`hfai nodes`: client nodes(), every page", b.client.wall, cpu_note(b.client)))
    print(ms_row("`hfai nodes`: the whole CLI process", b.cli.wall, cpu_note(b.cli) + "; one after another"))
    print(ms_row("`hfai nodes`: the whole CLI process, records all new", b.cli_fresh.wall,
                 cpu_note(b.cli_fresh) + f"; each {args.hb:g} s (a heartbeat interval) after the last"))
    print(ms_row("submit -> placed, one job at a time (a round)", b.placed))
    placed, ended = b.burst
    print(f"  burst of {args.burst} one-node jobs: all placed {placed * 1000:.0f} ms after the last submit, "
          f"all ended {ended:.1f} s after the first")
    cpu = ", ".join(f"{k} {v * 100:.0f}%" for k, v in b.idle_cpu.items())
    print(f"  idle CPU over {b.window_s:.0f} s (share of one core): {cpu}")


def conditions() -> str:
    load = os.getloadavg()[0]
    return (f"{os.cpu_count()} CPU cores (load average {load:.1f} at start), {platform.python_implementation()} "
            f"{platform.python_version()}, {psutil.virtual_memory().total / 2**30:.0f} GiB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=200, help="jobs per throughput run")
    p.add_argument("--small", default="3,100", help="node counts of the throughput runs ('' to skip)")
    p.add_argument("--big", type=int, default=1000, help="nodes of the big run (0 to skip)")
    p.add_argument("--fleets", type=int, default=2, help="fleet processes of the big run")
    p.add_argument("--hb", type=float, default=5.0, help="heartbeat interval of the big run, s")
    p.add_argument("--hb-timeout", type=float, default=30.0, help="heartbeat timeout of the big run, s")
    p.add_argument("--reconcile", type=float, default=2.0, help="agents' periodic reconcile of the big run, s")
    p.add_argument("--window", type=float, default=10.0, help="seconds of heartbeats watched")
    p.add_argument("--nodes-calls", type=int, default=20)
    p.add_argument("--cli-runs", type=int, default=3)
    p.add_argument("--fresh-runs", type=int, default=3,
                   help="`hfai nodes` runs a heartbeat interval apart (every record new to the controller)")
    p.add_argument("--probes", type=int, default=10)
    p.add_argument("--burst", type=int, default=100)
    p.add_argument("--stock-nats", action="store_true",
                   help="big run on nats-server as `hfai local` configures it (per-stream consumer cap kept)")
    p.add_argument("--up-timeout", type=float, default=300.0, help="for every node of the big run to be up, s")
    p.add_argument("--timeout", type=float, default=600.0, help="for a batch of jobs, s")
    p.add_argument("--keep", help="run the clusters under this directory and keep it (logs) afterwards")
    args = p.parse_args(argv)
    small = [int(n) for n in args.small.split(",") if n.strip()]
    print(f"hfai scale bench: {conditions()}")
    with tempfile.TemporaryDirectory(prefix="hfai-bench-scale-") as tmp:
        root = Path(args.keep or tmp)
        if small:
            results = [throughput(root / f"tp{n}", n, args.jobs, args.timeout) for n in small]
            print_throughput(results)
        if args.big:
            print_big(big(root / f"big{args.big}", args), args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
