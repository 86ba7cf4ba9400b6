"""Elastic jobs sized by what they gain: the gain policy against LAS and today's hfai policy.

Prints, for every policy in the same run, average JCT, p99 wait (submit to first start) and
interruptions per job:

* on traces derived from Pollux's artifact (bench/pollux_trace.py: measured throughput per
  placement, at node granularity, 16 nodes). Two variants of the same jobs: **rigid** (the size
  the workload asked for: what a user picks for Tiresias-style LAS, as Pollux compared) and
  **elastic** (``1:MAX`` with the speedup curve, what an elastic policy may use). LAS, hfai and
  hfai-gain run both; the targets compare hfai-gain on elastic with LAS on rigid and with hfai
  on whichever variant serves it better;
* on synthetic traces without curves (sim/tracegen.py, 8,000 jobs on 250 nodes at loads 1.2
  and 0.9, one priority, 30% of the multi-node jobs elastic), where the gain policy must make
  nothing worse.

Beside each Pollux workload it prints the fluid bounds of sim/oracle.py on the elastic variant
(every curve known, free and instant resizes at node granularity): **oracle-clairvoyant** also
knows each job's duration (shortest remaining time first); **oracle-blind** does not (least
attained service, FIFO within LAS's bands). Their rows have no p99 wait or interruptions.

Run: ``python bench/bench_elastic.py [--artifact PATH] [--workloads N ...] [--synthetic-jobs N]``.
``--artifact`` is a checkout of github:petuum/adaptdl at ``osdi21-artifact`` or a clone's git
directory; without it the checked-in ``bench/traces/pollux-workload-1-*.csv`` are used.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from hfai.controller.policy import PolicyConfig
from hfai.protocol.types import Priority
from hfai.sim import SimConfig, TraceJob, read_trace, simulate, tracegen
from hfai.sim.oracle import fluid_avg_jct
from hfai.sim.report import SimResult

HERE = Path(__file__).parent
#: (row name, policy, its settings): hfai-gain as the leader would run it, and with a 5% serial
#: prior (PolicyConfig.prior_serial) for sizes a job was not measured at.
POLICIES = (("las", "las", PolicyConfig()), ("hfai", "hfai", PolicyConfig()),
            ("hfai-gain", "hfai-gain", PolicyConfig()), ("gain-p5", "hfai-gain", PolicyConfig(prior_serial=0.05)))
NODES = 16  # Pollux's cluster: 16 nodes of 4 GPUs


def _run(args: tuple[str, list[TraceJob], int, tuple[str, str, PolicyConfig]]) -> tuple[str, str, SimResult]:
    label, trace, nodes, (name, policy, config) = args
    return label, name, simulate(trace, nodes, policy, SimConfig(policy=config))


def pollux_traces(artifact: str | None, workloads: list[str]) -> dict[str, list[TraceJob]]:
    if artifact is None:
        return {f"pollux-workload-1 {v}": read_trace(HERE / "traces" / f"pollux-workload-1-{v}.csv")
                for v in ("rigid", "elastic")}
    from pollux_trace import Artifact, convert  # bench/ is the script's folder

    art = Artifact(artifact)
    out: dict[str, list[TraceJob]] = {}
    for w in workloads:
        elastic, rigid = convert(art, w)
        out[f"{w} rigid"], out[f"{w} elastic"] = rigid, elastic
    return out


def row(label: str, policy: str, r: SimResult) -> str:
    return (f"{label:34s} {policy:10s} {r.avg_jct_s / 60:9.1f} {r.p99_queue_s / 60:9.1f} "
            f"{r.interrupts_per_job:6.2f}")


def oracle_row(label: str, name: str, avg_jct_s: float) -> str:
    return f"{label:34s} {name:10s} {avg_jct_s / 60:{max(1, 19 - len(name))}.1f}"


def bounds(results: dict[tuple[str, str], SimResult], stem: str, oracles: dict[str, float]) -> str:
    """What the fluid bounds get against LAS on rigid: no policy that must guess durations (the
    blind one) or pay restarts and slices can be expected to do better."""
    las = results[(f"{stem} rigid", "las")].avg_jct_s
    return (f"{stem}: the fluid bounds' avg JCT vs LAS: clairvoyant {oracles['clairvoyant'] / las - 1:+.0%}, "
            f"blind {oracles['blind'] / las - 1:+.0%}")


def verdict(results: dict[tuple[str, str], SimResult], stem: str, gain_row: str = "hfai-gain") -> list[str]:
    """The targets of one Pollux workload: hfai-gain on elastic against LAS on rigid (Pollux's
    comparison) and against today's hfai on its better variant."""
    gain = results[(f"{stem} elastic", gain_row)]
    las = results[(f"{stem} rigid", "las")]
    hfai = min((results[(f"{stem} {v}", "hfai")] for v in ("rigid", "elastic")), key=lambda r: r.avg_jct_s)
    vs_las, vs_hfai = 1 - gain.avg_jct_s / las.avg_jct_s, 1 - gain.avg_jct_s / hfai.avg_jct_s
    ok = lambda c: "met" if c else "NOT met"  # noqa: E731
    return [f"{stem}: {gain_row}'s avg JCT {-vs_las:+.0%} vs LAS ({ok(vs_las >= 0.30)}: <= -30%), {-vs_hfai:+.0%} vs "
            f"hfai ({ok(vs_hfai >= 0.25)}: <= -25%); {gain.interrupts_per_job:.2f} interruptions/job "
            f"({ok(gain.interrupts_per_job <= 1)}: <= 1); p99 wait {gain.p99_queue_s / 60:.1f} min vs LAS "
            f"{las.p99_queue_s / 60:.1f} ({ok(gain.p99_queue_s <= las.p99_queue_s)})"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--artifact", help="petuum/adaptdl at osdi21-artifact (checkout or git directory)")
    ap.add_argument("--workloads", nargs="*", default=["workloads/workload-1", "workloads/workload-2",
                                                       "workloads/workload-3"])
    ap.add_argument("--synthetic-jobs", type=int, default=8000)
    ap.add_argument("--synthetic-nodes", type=int, default=250)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args(argv)
    traces: dict[str, tuple[list[TraceJob], int]] = {k: (v, NODES) for k, v in
                                                    pollux_traces(a.artifact, a.workloads).items()}
    for load in (1.2, 0.9):
        # One priority: LAS ignores priorities, so only then is it hfai's peer (docs/scheduling.md).
        trace = [replace(j, priority=Priority.NORMAL.value)
                 for j in tracegen.generate(a.synthetic_jobs, a.synthetic_nodes, load=load, seed=0, elastic=0.3)]
        traces[f"synthetic load {load} (no curves)"] = (trace, a.synthetic_nodes)
    jobs = [(label, trace, nodes, p) for label, (trace, nodes) in traces.items() for p in POLICIES]
    with ProcessPoolExecutor(max_workers=a.workers, mp_context=multiprocessing.get_context("fork")) as pool:
        done = list(pool.map(_run, jobs))
    results = {(label, policy): r for label, policy, r in done}
    stems = sorted({label.rsplit(" ", 1)[0] for label in traces if label.endswith(" elastic")})
    oracles = {stem: {kind: fluid_avg_jct(traces[f"{stem} elastic"][0], NODES, clairvoyant=kind == "clairvoyant")
                      for kind in ("clairvoyant", "blind")} for stem in stems}
    print(f"{'trace':34s} {'policy':10s} {'avg JCT':>9s} {'p99 wait':>9s} {'intr/job':>8s}")
    print(f"{'':34s} {'':10s} {'(min)':>9s} {'(min)':>9s}")
    for label, policy, r in done:
        print(row(label, policy, r))
        stem = label.rsplit(" ", 1)[0]
        if label.endswith(" elastic") and policy == POLICIES[-1][0]:
            for kind, jct in oracles[stem].items():
                print(oracle_row(label, f"oracle-{kind}", jct))
    print()
    for stem in stems:
        lines = verdict(results, stem) + verdict(results, stem, "gain-p5") + [bounds(results, stem, oracles[stem])]
        print("\n".join(lines))
    for label in traces:
        if label.startswith("synthetic"):
            g, h, las = (results[(label, p)] for p in ("hfai-gain", "hfai", "las"))
            p5 = results[(label, "gain-p5")]
            print(f"{label}: hfai-gain/hfai avg JCT {g.avg_jct_s / h.avg_jct_s:.3f}x, p99 wait "
                  f"{g.p99_queue_s / max(h.p99_queue_s, 1e-9):.3f}x, interruptions/job {g.interrupts_per_job:.2f} "
                  f"(hfai {h.interrupts_per_job:.2f}); hfai-gain/LAS avg JCT {g.avg_jct_s / las.avg_jct_s:.3f}x; "
                  f"gain-p5/hfai {p5.avg_jct_s / h.avg_jct_s:.3f}x at {p5.interrupts_per_job:.2f} interruptions/job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
