"""`hfai nodes` at cluster scale, in one process: the controller's pages of nodes and the
client's decoding and table, against the controller's old way measured in the same run.

The old way (kept below as ``old_pages``, the baseline) builds the info of every node for every
page, encodes each remaining node to size the page, then encodes the page again. The controller
splices each page from packed items (controller/paging.py), a node's heartbeat record packed
once while it is current (controller/node_pages.py): "new records" is a
request after every node sent a heartbeat (each record packed once), "unchanged" one right after
another.

    .venv/bin/python bench/bench_nodes.py [--nodes 1000] [--finished 20000] [--reps 5]

Prints figures and ratios only; nothing here is a timed assertion. The whole `hfai nodes` on a
real cluster (NATS, agents, a CLI process): bench/bench_scale.py.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import time
from collections.abc import Callable
from types import SimpleNamespace

from hfai.agent.gpu import SimulatedGpus
from hfai.cli import render
from hfai.controller.api import ApiService, Caller
from hfai.controller.nodes import NodeTracker
from hfai.core.config import ControllerConfig
from hfai.protocol import decode, encode
from hfai.protocol.types import ChainState, HostStat, JobRecord, JobSpec, NodeRecord, NodesReply, NodesRequest


def heartbeat(i: int, seq: int, gpus: SimulatedGpus) -> NodeRecord:
    """A node's record as a fleet agent sends it (8 simulated GPUs, host figures)."""
    return NodeRecord(name=f"node-{i:05d}", group="default", address=f"10.0.{i // 256}.{i % 256}:7000",
                      ts=time.time(), seq=seq, gpus=gpus.sample(busy=i % 2 == 0),
                      host=HostStat(cpu_percent=3.0, memory_used=10**10, memory_total=10**11, load1=0.5),
                      envs=("base", "torch"), gpu_source="sim", runs=(), agent_version="0.1.0")


@dataclasses.dataclass
class Cluster:
    cache: SimpleNamespace
    api: ApiService
    budget: int
    nodes: int
    gpus: SimulatedGpus
    seq: int = 0

    def beat(self) -> None:
        """Every node sends a heartbeat (a new record object each, as the KV watch makes them)."""
        self.seq += 1
        self.cache.values = {r.name: r for r in (heartbeat(i, self.seq, self.gpus) for i in range(self.nodes))}
        now = time.monotonic()
        self.cache.seen = dict.fromkeys(self.cache.values, now)


def cluster(nodes: int, finished: int) -> Cluster:
    gpus = SimulatedGpus()
    cache = SimpleNamespace(values={}, revisions={}, seen={})
    spec = JobSpec(name="train", entrypoint=("python", "t.py"), workdir="/w", nodes=4, user="u")
    jobs = {f"j{k}": JobRecord(id=f"j{k}", spec=spec, state=ChainState.RUNNING, submit_ts=1.0,
                               nodes=tuple(f"node-{i:05d}" for i in range(4 * k, 4 * k + 4)))
            for k in range(nodes // 8)}  # half the nodes busy
    for k in range(finished):  # kept for finished_retention_s; every page looks at them too
        jobs[f"f{k}"] = JobRecord(id=f"f{k}", spec=spec, state=ChainState.SUCCEEDED, submit_ts=1.0,
                                  nodes=(f"node-{k % nodes:05d}",))
    config = ControllerConfig()
    api = ApiService(None, SimpleNamespace(values=jobs), NodeTracker(cache, 30.0),  # type: ignore[arg-type]
                     config=config)
    c = Cluster(cache, api, config.api_reply_bytes, nodes, gpus)
    c.beat()
    return c


LOOP = asyncio.new_event_loop()  # one for the run: asyncio.run() costs more than a warm page


def page_starts(c: Cluster) -> list[str]:
    """The ``after`` of each page the client asks for (after each page's last node)."""
    out = [""]
    while True:
        reply = LOOP.run_until_complete(c.api.nodes(Caller("u"), NodesRequest(after=out[-1])))
        page = decode(encode(reply), NodesReply)
        if not (page.more and page.nodes):
            return out
        out.append(page.nodes[-1].record.name)


def new_pages(c: Cluster, starts: list[str]) -> list[bytes]:
    """Every page as the controller now answers them."""
    return [encode(LOOP.run_until_complete(c.api.nodes(Caller("u"), NodesRequest(after=a)))) for a in starts]


def old_first_page(items: list, budget_bytes: int) -> tuple[tuple, bool]:
    used = 0
    for n, item in enumerate(items):
        used += len(encode(item))
        if used > budget_bytes and n > 0:
            return tuple(items[:n]), True
    return tuple(items), False


def old_pages(c: Cluster) -> list[bytes]:
    """Every page as the old way builds them (the baseline)."""
    out: list[bytes] = []
    jobs = c.api._jobs.values
    after = ""
    while True:
        infos = sorted(c.api._nodes.infos(list(jobs.values())), key=lambda i: i.record.name)
        page, more = old_first_page([i for i in infos if i.record.name > after], c.budget)
        out.append(encode(NodesReply(nodes=page, more=more)))
        if not (more and page):
            return out
        after = page[-1].record.name


def best(fn: Callable[[], object], reps: int, before: Callable[[], None] | None = None) -> float:
    """The fastest of ``reps`` runs, in seconds (``before`` runs untimed ahead of each)."""
    times = []
    for _ in range(reps):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--finished", type=int, default=20000, help="finished jobs kept (every page looks at them)")
    args = p.parse_args(argv)
    c = cluster(args.nodes, args.finished)
    starts = page_starts(c)
    pages = new_pages(c, starts)
    shown = [n.record for d in pages for n in decode(d, NodesReply).nodes]
    old_shown = [n.record for d in old_pages(c) for n in decode(d, NodesReply).nodes]
    assert shown == old_shown == list(c.cache.values.values()), "the pages do not show every node once, in order"
    print(f"hfai nodes bench: {args.nodes} nodes (8 GPUs each), {args.finished} finished jobs kept, "
          f"{len(pages)} pages of at most {c.budget} bytes, "
          f"{sum(map(len, pages)) / args.nodes:.0f} bytes a node; {os.cpu_count()} CPU cores, "
          f"load average {os.getloadavg()[0]:.1f}")
    old_fresh = best(lambda: old_pages(c), args.reps, c.beat)
    new_fresh = best(lambda: new_pages(c, starts), args.reps, c.beat)
    old_same = best(lambda: old_pages(c), args.reps)
    new_same = best(lambda: new_pages(c, starts), args.reps)
    decoded: list = []
    dec = best(lambda: decoded.__setitem__(slice(None), [n for d in pages for n in decode(d, NodesReply).nodes]),
               args.reps)
    table = best(lambda: render.nodes_table(decoded), args.reps)
    print(f"  {'controller, every page':<40} {'old ms':>8} {'new ms':>8} {'old/new':>8}")
    for label, old, new in (("new records (after heartbeats)", old_fresh, new_fresh),
                            ("unchanged records", old_same, new_same)):
        print(f"  {label:<40} {old * 1000:8.1f} {new * 1000:8.1f} {old / new:8.1f}x")
    print(f"  client: decode every page {dec * 1000:.1f} ms, the table {table * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
