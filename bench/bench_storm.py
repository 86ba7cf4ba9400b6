"""Un-draining nodes under a long queue (issue 38 §6): a real cluster (nats-server, a controller,
simulated agents in a fleet process, bench_scale.py's set-up) with every node drained and
``--queued`` one-node jobs of one user waiting; then every node is un-drained at once.

Printed: seconds from the un-drain to ``--nodes`` jobs running (target: 2 s at 20,000 queued and
64 nodes), job-record writes in the ``--window`` seconds after it (the storm was one per waiting
job), and another user's `hfai ps --mine` (the client's list of its own jobs) during the window,
beside the same user's `hfai ps` of everyone's (the 20,000 rows) as the peer figure.

    python bench/bench_storm.py [--queued 20000] [--nodes 64] [--window 20]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench_scale import USER, fleet_cluster, pct
from bench_throughput import kv_revisions

from hfai.api.client import ApiClient, JobFilter
from hfai.cli.local.layout import LOCAL_AGENT, LOCAL_CONTROLLER
from hfai.protocol import names
from hfai.protocol.errors import Unavailable
from hfai.protocol.types import ChainState, JobSpec

OPS, OTHER = "ops", "carol"


async def submit_queue(api: ApiClient, n: int, workdir: str, batch: int = 64) -> int:
    """``n`` one-node jobs, ``batch`` submits in flight (job arrays of hundreds, one request
    each, outlast the request timeout once the queue is long). Returns how many submits got no
    answer in time on a busy host (each may or may not have made its job)."""
    spec = JobSpec(name="q", entrypoint=("sleep", "600"), workdir=workdir, nodes=1)
    unanswered = 0
    for i in range(0, n, batch):
        done = await asyncio.gather(*(api.submit(dataclasses.replace(spec, name=f"q{k}"), force=True)
                                      for k in range(i, min(n, i + batch))), return_exceptions=True)
        for r in done:
            if isinstance(r, Unavailable):
                unanswered += 1
            elif isinstance(r, BaseException):
                raise r
    return unanswered


async def timed(call) -> float:
    t = time.monotonic()
    await call
    return time.monotonic() - t


async def scenario(config, args, workdir: str) -> dict[str, object]:
    async with ApiClient(config, user=OPS) as ops, ApiClient(config, user=USER) as bench, \
            ApiClient(config, user=OTHER) as other:
        nodes = [i.record.name for i in await ops.nodes()]
        for n in nodes:
            await ops.drain(n, True, "bench")
        t = time.monotonic()
        unanswered = await submit_queue(bench, args.queued, workdir)
        queued = len(await bench.jobs(JobFilter.of(users=(USER,))))
        submit_s = time.monotonic() - t
        await other.submit(JobSpec(name="mine", entrypoint=("true",), workdir=workdir, nodes=1))
        await asyncio.sleep(args.settle)  # the queue is explained once; the cluster is quiet
        before = await kv_revisions(config, args.creds)
        t0, wall0 = time.monotonic(), time.time()
        await asyncio.gather(*(ops.drain(n, False) for n in nodes))
        mine: list[float] = []
        while time.monotonic() - t0 < args.window:
            mine.append(await timed(other.jobs(JobFilter.of(users=(OTHER,)))))
            await asyncio.sleep(0.2)
        after = await kv_revisions(config, args.creds)
        everyone = [await timed(other.jobs(JobFilter.of())) for _ in range(3)]
        ran = await bench.jobs(JobFilter.of(users=(USER,), states=("running", "succeeded", "failed")))
    # When each job began running, on the controller's clock (this host's: the same wall clock).
    starts = sorted(e.ts - wall0 for j in ran for e in j.history if e.state is ChainState.RUNNING)
    started = starts[len(nodes) - 1] if len(starts) >= len(nodes) else None
    return {"nodes": len(nodes), "submit_s": submit_s, "queued": queued, "unanswered": unanswered,
            "started_s": started, "first_s": starts[0] if starts else None, "running": len(ran),
            "writes": after[names.BUCKET_JOBS] - before[names.BUCKET_JOBS], "mine": mine, "everyone": everyone}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--queued", type=int, default=20000)
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--window", type=float, default=20.0, help="seconds watched after the un-drain")
    p.add_argument("--settle", type=float, default=5.0)
    args = p.parse_args(argv)
    agent = dataclasses.replace(LOCAL_AGENT, run_as="agent")
    with tempfile.TemporaryDirectory(prefix="bench-storm-") as tmp:
        root = Path(tmp)
        with fleet_cluster(root, args.nodes, 1, agent, LOCAL_CONTROLLER, up_timeout_s=300.0) as fc:
            fc.cluster.user_creds(OPS, operator=True)
            fc.cluster.user_creds(OTHER)
            args.creds = fc.service_creds()
            r = asyncio.run(scenario(fc.config, args, str(root)))
    mine, everyone = r["mine"], r["everyone"]
    started = r["started_s"]
    print(f"{r['queued']} queued, {r['nodes']} nodes un-drained at once (submitting took {r['submit_s']:.0f} s; "
          f"{r['unanswered']} submits unanswered within the request timeout)")
    first = r["first_s"]
    print(f"  {r['nodes']} jobs running after  : {'not within the window' if started is None else f'{started:.2f} s'}"
          f" (target 2 s; the first after {'-' if first is None else f'{first:.2f} s'}); "
          f"{r['running']} started in the window")
    print(f"  job-record writes in {args.window:g} s: {r['writes']} ({r['writes'] / r['queued']:.3f} per queued job)")
    print(f"  another user's ps --mine  : median {statistics.median(mine) * 1e3:.0f} ms, "
          f"p95 {pct(mine, 0.95) * 1e3:.0f} ms over {len(mine)} calls (target 0.5 s)")
    print(f"  peer: ps of everyone's    : median {statistics.median(everyone) * 1e3:.0f} ms "
          f"({statistics.median(everyone) / statistics.median(mine):.0f}x --mine)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
