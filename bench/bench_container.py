"""What a compute container adds to starting a run: the time from the agent's start of a run to the
job's first line in its log, with a bwrap container and cgroup (agent/contain.py) against a bare
process, measured in the same run, through the agent's own code path (RunStore, the zygote's
launcher, the launcher's output relay). The job is ``sh -c 'echo first'``, so the figures are the
platform's own cost, not an interpreter's start.

Target (issue "compute containers"): at most 10 ms added at the median.

    python bench/bench_container.py [--runs 40]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hfai.agent.contain import make_containment
from hfai.agent.runs import RunStore
from hfai.core.config import AgentConfig
from hfai.protocol.types import DesiredRun, RunAssignment


def _ra(i: int, workdir: str) -> RunAssignment:
    return RunAssignment(job_id=f"bench{i}", run_id=1, name="bench", user="bench", group="default", priority=10,
                         rank=0, world_size=1, master_addr="127.0.0.1", master_port=20000,
                         entrypoint=("sh", "-c", "echo first"), workdir=workdir, desired=DesiredRun.RUN)


def first_line_ms(store: RunStore, i: int, workdir: str) -> float:
    ra = _ra(i, workdir)
    t0 = time.perf_counter()
    store.start(ra)
    log = store.log_path(ra.job_id, 0)
    while b"first" not in log.read_bytes():
        time.sleep(0.0002)
    took = (time.perf_counter() - t0) * 1000
    while store.snapshot()[ra.key].exit_code is None:  # the next run starts on a quiet node
        time.sleep(0.002)
    store.cleanup(ra.key)
    return took


def measure(kind: str, runs: int, base: Path, turn: int) -> list[float]:
    ac = dataclasses.replace(AgentConfig(), run_as="agent", container=kind, cgroup_name="hfai-bench",
                             cgroups=kind != "none")
    containment = make_containment(ac, f"bench-{kind}", "", "", "", 16 * 2**30)
    assert containment.sandbox.name == kind, containment.summary
    store = RunStore(base / f"{kind}{turn}" / "state", f"bench-{kind}", base / "envs", run_as="agent",
                     containment=containment)
    workdir = base / "work"
    workdir.mkdir(exist_ok=True)
    first_line_ms(store, -1, str(workdir))  # warm the zygote and the page cache
    return [first_line_ms(store, i, str(workdir)) for i in range(runs)]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=40)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="hfai-bench-container-") as tmp:
        base = Path(tmp)
        # Taking turns, so that both see the same machine.
        bare: list[float] = []
        boxed: list[float] = []
        for turn in range(4):
            bare += measure("none", args.runs // 4, base, turn)
            boxed += measure("bwrap", args.runs // 4, base, turn)
    for name, xs in (("bare process", bare), ("bwrap + cgroup", boxed)):
        qs = statistics.quantiles(xs, n=20)
        print(f"{name:>15}: launch -> first line  p50 {statistics.median(xs):6.2f} ms  p95 {qs[-1]:6.2f} ms  "
              f"({len(xs)} runs)")
    added = statistics.median(boxed) - statistics.median(bare)
    print(f"container adds {added:.2f} ms at p50 (target <= 10 ms); "
          f"ratio bwrap/bare {statistics.median(boxed) / statistics.median(bare):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
