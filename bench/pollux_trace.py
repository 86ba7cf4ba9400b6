"""Pollux's artifact as hfai traces, at node granularity.

Source: the OSDI'21 artifact of Pollux (Qiao et al., "Pollux: Co-adaptive Cluster Scheduling for
Goodput-Optimized Deep Learning"), github:petuum/adaptdl, branch ``osdi21-artifact``:
``simulator/traces/<model>/placements.csv`` and ``scalability.csv`` (measured step times per
placement and per-GPU batch size), ``validation-<batch>.csv`` (iterations per epoch at each
global batch size), and the workloads ``benchmark/workloads*/workload-N.csv`` (name, submit
time, model, GPUs asked for, global batch size). Nothing of theirs is copied into this
repository: this module reads the artifact (a checkout, or the git directory of a clone) when
the bench runs; ``bench/traces/pollux-workload-1.csv`` is a trace it generated.

The conversion, per job:

* One Pollux node (4 GPUs) is one hfai node; sizes are 1..16 nodes (their cluster's 16).
* The job keeps its global batch size (hfai does not tune batch sizes; Pollux's goodput gains
  from doing so are not claimed here). On ``k`` nodes each of the ``4k`` GPUs computes
  ``ceil(batch / 4k)`` samples a step, with gradient accumulation above the model's largest
  per-GPU batch, as Pollux's simulator does; its step time is interpolated in the measured
  per-GPU batch sizes of the placement ``4...4`` (k <= 4) or of ``scalability.csv`` (6, 8, 12,
  16 nodes), and the throughput of sizes between those is interpolated linearly. A size whose
  per-GPU batch would be below the smallest measured one is not used (the job's MAX stops there).
* ``speedup`` is the throughput on 1..MAX nodes over that on one node, MAX the size of the
  highest throughput; the job's work is the iterations of ``max_epochs`` epochs (Pollux's
  settings per model) at its batch size, and ``duration_s`` its run time on MAX nodes.
* Two traces of the same jobs: **elastic** (``1:MAX``: what an elastic policy may use) and
  **rigid** (the size the workload asked for, ``ceil(GPUs / 4)`` nodes, at most MAX: what a user
  picks for Tiresias-style LAS, which is how Pollux compared). Each job is its own user.

Run: ``python bench/pollux_trace.py ARTIFACT OUT_DIR [--workload workloads/workload-1]``.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import io
import math
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hfai.sim.trace import TraceJob, write_trace

BRANCH = "osdi21-artifact"
GPUS_PER_NODE = 4
MAX_NODES = 16
#: Pollux's simulator/applications.py: epochs to completion and the per-GPU batch cap per model.
MODELS = {"bert": (2, None), "cifar10": (100, None), "ncf": (10, None), "imagenet": (90, None),
          "deepspeech2": (80, None), "yolov3": (50, 8)}


class Artifact:
    """Files of the artifact, from a checkout or from a git directory (``git show``)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.checkout = (self.path / "simulator").is_dir()

    def read(self, name: str) -> list[dict[str, str]]:
        if self.checkout:
            text = (self.path / name).read_text()
        else:
            text = subprocess.run(["git", f"--git-dir={self.path}", "show", f"{BRANCH}:{name}"], check=True,
                                  capture_output=True, text=True).stdout
        return list(csv.DictReader(io.StringIO(text)))

    def names(self, folder: str) -> list[str]:
        if self.checkout:
            return sorted(p.name for p in (self.path / folder).iterdir())
        out = subprocess.run(["git", f"--git-dir={self.path}", "ls-tree", "--name-only", f"{BRANCH}:{folder}"],
                             check=True, capture_output=True, text=True).stdout
        return sorted(out.split())


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Linear interpolation in sorted ``xs``, clamped at the ends."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass
class Model:
    name: str
    epochs: int
    max_local: float
    min_local: float
    #: nodes -> (per-GPU batch sizes, step times, sync times), sorted by batch size
    steps: dict[int, tuple[list[float], list[float], list[float]]]
    iterations: dict[int, list[int]]  # global batch size -> iterations after each epoch

    def step_time(self, nodes: int, batch: int) -> float | None:
        """Seconds per step of a global ``batch`` on ``nodes`` full nodes (None: not measured
        there, or the per-GPU batch would be below the smallest measured)."""
        gpus = nodes * GPUS_PER_NODE
        local = math.ceil(batch / gpus - 1e-8)
        if local < self.min_local or nodes not in self.steps:
            return None
        accum = math.ceil(local / self.max_local - 1e-8) - 1
        atomic = math.ceil(local / (accum + 1) - 1e-8)
        bs, st, sy = self.steps[nodes]
        step, sync = _interp(bs, st, atomic), _interp(bs, sy, atomic)
        return step + accum * (step - sync)

    def curve(self, batch: int) -> list[float]:
        """Throughput (samples/s) on 1..MAX_NODES nodes; stops at the first unusable size."""
        known: dict[int, float] = {}
        for k in range(1, MAX_NODES + 1):
            t = self.step_time(k, batch)
            if t is not None:
                known[k] = batch / t
            elif math.ceil(batch / (k * GPUS_PER_NODE) - 1e-8) < self.min_local:
                break
        if not known:  # a batch too small even for one full node: run it there anyway
            known[1] = batch / self.step_time(1, max(batch, math.ceil(self.min_local) * GPUS_PER_NODE))  # type: ignore[operator]
        ks = sorted(known)
        return [_interp(ks, [known[k] for k in ks], k) for k in range(1, ks[-1] + 1)]

    def iterations_at(self, batch: int) -> float:
        sizes = sorted(self.iterations)
        lo = max((b for b in sizes if b <= batch), default=sizes[0])
        hi = min((b for b in sizes if b >= batch), default=sizes[-1])
        a, b = self.iterations[lo], self.iterations[hi]
        e = min(self.epochs, len(a), len(b)) - 1
        if lo == hi:
            return float(a[e])
        return ((batch - lo) * b[e] + (hi - batch) * a[e]) / (hi - lo)


def load_model(art: Artifact, name: str) -> Model:
    epochs, cap = MODELS[name]
    base = f"simulator/traces/{name}"
    steps: dict[int, list[tuple[float, float, float]]] = {}
    locals_: list[float] = []
    for r in art.read(f"{base}/placements.csv"):
        p = r["placement"]
        locals_.append(float(r["local_bsz"]))
        if set(p) == {str(GPUS_PER_NODE)}:  # every node full
            steps.setdefault(len(p), []).append((float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"])))
    for r in art.read(f"{base}/scalability.csv"):
        n, g = int(r["num_nodes"]), int(r["num_replicas"])
        if g == n * GPUS_PER_NODE and n not in {k for k in steps if k <= 4}:
            steps.setdefault(n, []).append((float(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"])))
    table = {}
    for n, rows in steps.items():
        rows.sort()
        table[n] = ([r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows])
    iterations = {}
    for f in art.names(base):
        if f.startswith("validation-") and f.endswith(".csv"):
            iterations[int(f[len("validation-"):-4])] = [int(r["iteration"]) for r in art.read(f"{base}/{f}")]
    return Model(name, epochs, float(cap or max(locals_)), min(locals_), table, iterations)


def convert(art: Artifact, workload: str) -> tuple[list[TraceJob], list[TraceJob]]:
    """(elastic, rigid) traces of ``benchmark/<workload>.csv``: the same jobs, see the module doc."""
    models: dict[str, Model] = {}
    elastic: list[TraceJob] = []
    rigid: list[TraceJob] = []
    for r in art.read(f"benchmark/{workload}.csv"):
        name = r["application"]
        model = models.get(name) or models.setdefault(name, load_model(art, name))
        batch = int(r["batch_size"])
        rates = model.curve(batch)
        top = max(range(len(rates)), key=lambda i: (rates[i], -i)) + 1
        speedup = tuple(x / rates[0] for x in rates[:top])
        one_node_s = model.iterations_at(batch) * batch / rates[0]
        asked = min(max(1, math.ceil(int(r["num_replicas"]) / GPUS_PER_NODE)), top)
        submit = float(r["time"])
        elastic.append(TraceJob(submit, one_node_s / speedup[-1], 1, user=r["name"], max_nodes=top if top > 1 else 0,
                                speedup=speedup))
        rigid.append(TraceJob(submit, one_node_s / speedup[asked - 1], asked, user=r["name"],
                              speedup=speedup[:asked]))
    return elastic, rigid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("artifact", help="a checkout of petuum/adaptdl at osdi21-artifact, or a clone's git directory")
    ap.add_argument("out", help="folder for <workload>-elastic.csv and <workload>-rigid.csv")
    ap.add_argument("--workload", default="workloads/workload-1", help="benchmark/<this>.csv (default %(default)s)")
    a = ap.parse_args(argv)
    elastic, rigid = convert(Artifact(a.artifact), a.workload)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = a.workload.replace("/", "-")
    for variant, jobs in (("elastic", elastic), ("rigid", rigid)):
        path = out / f"{stem}-{variant}.csv"
        write_trace(path, jobs)
        source = (f"# Derived by bench/pollux_trace.py ({variant}) from github:petuum/adaptdl, branch {BRANCH} "
                  f"(Pollux, OSDI'21; Apache-2.0):\n# benchmark/{a.workload}.csv and simulator/traces/*/"
                  f"{{placements,scalability,validation-*}}.csv. One node = 4 GPUs.\n")
        path.write_text(source + path.read_text())
    print(f"{len(elastic)} jobs -> {out}/{stem}-{{elastic,rigid}}.csv", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
