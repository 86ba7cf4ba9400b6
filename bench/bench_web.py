"""One page load of hfai-web with 1,000 jobs and 128 nodes, against `hfai ps -a` for the same data.

A real local cluster (nats-server, a controller, hfai-web; no agents): 128 node records are
written to hfai_nodes with the controller's credentials, 1,000 jobs are submitted through the API
(the leader places 128 of them). Then, signed in as a user, the jobs page (HTML + its JSON) and the
nodes JSON are fetched; the peers are `hfai ps -a` run as a CLI process and the API's own list call
(what the page's JSON waits on). Prints medians and ratios; never asserts.

    python bench/bench_web.py [--jobs 1000] [--nodes 128] [--rounds 15]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from spine_cluster import Cluster  # noqa: E402

from hfai.core.config import WebConfig  # noqa: E402
from hfai.protocol import encode  # noqa: E402
from hfai.protocol.types import GpuStat, HostStat, JobSpec, NodeRecord  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def write_nodes(c: Cluster, count: int) -> None:
    from hfai.core import nats as _nats

    nc = await _nats.connect(c.config, "bench-nodes", reconnect=False, creds=str(c.service_creds()))
    try:
        kv = await nc.jetstream().key_value("hfai_nodes")
        for i in range(count):
            gpus = tuple(GpuStat(index=g, name="sim", utilization=50.0, memory_used=1 << 30, memory_total=80 << 30,
                                 temperature=40.0, power_w=300.0) for g in range(8))
            rec = NodeRecord(name=f"bench-{i:03d}", group="default", address="127.0.0.1", ts=time.time(), seq=1,
                             gpus=gpus, host=HostStat(cpu_percent=10, memory_used=1, memory_total=2, load1=0.1))
            await kv.put(rec.name, encode(rec))
    finally:
        await nc.close()


def median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **kw):
        return None


def sign_in(base: str, creds: str) -> str:
    form = urllib.parse.urlencode({"creds": creds}).encode()
    try:
        urllib.request.build_opener(_NoRedirect).open(urllib.request.Request(base + "/login", data=form))
    except urllib.error.HTTPError as e:
        if e.code == 302:
            return e.headers["Set-Cookie"].split(";")[0]
        raise
    raise RuntimeError("sign-in did not redirect")


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--nodes", type=int, default=128)
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        c = Cluster(Path(tmp) / "cluster", nodes=0, heartbeat_timeout_s=3600.0)
        c.local.web = web = WebConfig(port=free_port())
        with c:
            asyncio.run(write_nodes(c, args.nodes))

            async def submit_all(api):
                for i in range(args.jobs):
                    await api.submit(JobSpec(name=f"job-{i}", entrypoint=("true",), workdir="/tmp", nodes=1))

            c.run(submit_all)
            base = f"http://127.0.0.1:{web.port}"
            c.wait(lambda: urllib.request.urlopen(base + "/healthz").status == 200, 30, "hfai-web")
            cookie = sign_in(base, c.creds("tester").read_text())

            def get(path: str) -> bytes:
                req = urllib.request.Request(base + path, headers={"Cookie": cookie})
                with urllib.request.urlopen(req, timeout=60) as r:
                    return r.read()

            count = get("/api/jobs").count(b'"submitted"')
            nodes = get("/api/nodes").count(b'"last_seen"')
            page = median_ms(lambda: (get("/jobs"), get("/api/jobs")), args.rounds)
            nodes_ms = median_ms(lambda: get("/api/nodes"), args.rounds)
            api_ms = median_ms(lambda: c.run(lambda api: api.list()), args.rounds)
            ps_ms = median_ms(lambda: c.cli("ps", "-a"), max(3, args.rounds // 3))
    print(f"hfai-web jobs page (HTML + JSON, {count} jobs): {page:.1f} ms median")
    print(f"hfai-web nodes JSON ({nodes} nodes, charts included): {nodes_ms:.1f} ms median")
    print(f"peer `hfai ps -a` (CLI process, same jobs): {ps_ms:.1f} ms median -> page/ps = {page / ps_ms:.2f}")
    print(f"peer ApiClient.list() in process (what the JSON waits on): {api_ms:.1f} ms -> page/list = "
          f"{page / api_ms:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
