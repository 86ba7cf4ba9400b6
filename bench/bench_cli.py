"""How fast the ``hfai`` command answers, measured as whole processes on a real local cluster.

``hfai --help``, ``hfai ps`` and ``hfai status ID`` (a submitted job's) are each started ``--runs``
times as a fresh process, as a user at a terminal or a ``watch``/script loop starts them; the
wall time from start to exit is taken, start-up and imports included, and the process's CPU time
(user + system: steadier than the wall time on a shared machine, and what the client's own code
decides). Printed: the median and the spread of each, its median CPU time, the ratio to the target
(0.15 s: a squeue-like answer), and the ratio to the floor measured in the same run, ``python -c
pass`` of the same interpreter (what no Python CLI can beat). The commands take turns, run by
run, so that a change of the machine's load falls on all of them alike. With ``--imports``, what
each command imports that costs most (``python -X importtime``); with ``--stages``, where the time
of an ``hfai status ID`` goes after the interpreter's start: each group of imports in the order a
call makes them, then the command itself (medians of fresh processes, timed inside them). With
``--rev REV`` (repeatable), ``hfai ps`` and ``hfai status ID`` also run as commit REV of this
repository has them, taking turns with the others: its package laid out as installed, first on
PYTHONPATH (before and after a change, measured in the same run).

    python bench/bench_cli.py [--runs 15] [--imports] [--stages] [--rev REV ...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

from hfai.cli.local import LocalCluster

TARGET_S = 0.15


def timed_run(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of one run of ``cmd`` as a whole process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    took = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    return took, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def top_imports(cmd: list[str], env: dict[str, str], n: int = 6) -> list[tuple[int, str]]:
    """The ``n`` top-level imports of ``cmd`` with the largest cumulative time (microseconds)."""
    r = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], env=env, capture_output=True, text=True)
    rows = []
    for line in r.stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _self, cum, name = line.split(":", 1)[1].split("|")
        if not name.startswith("  "):  # a top-level import (nested ones are indented further)
            rows.append((int(cum), name.strip()))
    return sorted(rows, reverse=True)[:n]


#: Run in a fresh interpreter: the imports of a call in its order, grouped, then the command itself.
#: The command's module and what it needs load as a call loads them (hfai.cli.main._loading: the
#: cyclic collector paused). What the exit costs is in the whole process's time only (a query run as
#: the process's own command skips the interpreter's teardown: hfai.cli.main._exit_now).
STAGES = r"""
import sys, time, json
marks = [("start", time.perf_counter())]
def mark(what): marks.append((what, time.perf_counter()))
import hfai; mark("hfai (runtime/__init__: typing)")
import click; mark("click")
import hfai.cli.main; mark("cli/main.py")
with hfai.cli.main._loading("hfai.cli.jobs"):
    import asyncio, hfai.api._light_nats; mark("asyncio and nats-py's core client")
    import hfai.protocol.codec; mark("hfai.protocol (codec, types, reasons, msgpack)")
    import hfai.cli.common; mark("cli/common.py, errors.py, render.py")
    import hfai.core.config; mark("hfai.core.config (its dataclasses made at first use)")
    import hfai.api.client; mark("hfai.api.client (hfai.core.nats, protocol.names, api.config)")
    import hfai.cli.jobs; mark("cli/jobs.py, arrays.py")
import hfai.auth.nkey, nacl._sodium; mark("PyNaCl's libsodium module (signing the server's nonce)")
from hfai.cli.main import main
try:
    main(sys.argv[1:], standalone_mode=False)
except SystemExit:
    pass
mark("the command: config, credentials (read once), connect, request, decode, print")
print(json.dumps([(what, (t - marks[i][1]) * 1000) for i, (what, t) in enumerate(marks[1:])]), file=sys.stderr)
"""


def stages(cmd_args: list[str], env: dict[str, str], runs: int) -> list[tuple[str, float]]:
    """(stage, median milliseconds) of ``hfai *cmd_args`` over ``runs`` fresh processes."""
    got: dict[str, list[float]] = {}
    for i in range(runs + 1):
        r = subprocess.run([sys.executable, "-c", STAGES, *cmd_args], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"stages of hfai {' '.join(cmd_args)} failed: {r.stderr.strip()[-500:]}")
        if i:
            for what, ms in json.loads(r.stderr.strip().splitlines()[-1]):
                got.setdefault(what, []).append(ms)
    return [(what, statistics.median(ms)) for what, ms in got.items()]


REPO = Path(__file__).resolve().parent.parent


def package_at(rev: str, into: Path) -> Path:
    """A folder that, first on PYTHONPATH, makes ``import hfai`` the package as commit ``rev`` has it:
    its files laid out as pyproject's package-dir installs them (runtime/ as hfai, cli/ as
    hfai/cli, ...)."""
    src, site = into / "src", into / "site"
    src.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    dirs = tomllib.loads((src / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.copytree(src / dirs["hfai"], site / "hfai")
    for package, folder in dirs.items():
        if package.startswith("hfai.") and not folder.startswith(dirs["hfai"] + "/"):
            (site / package.replace(".", "/")).symlink_to(src / folder, target_is_directory=True)
    return site


def submit_one(cluster: LocalCluster, workdir: Path) -> str:
    from hfai.api.client import ApiClient
    from hfai.protocol.types import JobSpec

    async def go() -> str:
        async with ApiClient(cluster.config()) as api:
            job = await api.submit(JobSpec(name="bench-cli", entrypoint=(sys.executable, "-c", "pass"),
                                           workdir=str(workdir)))
            return job.id

    return asyncio.run(go())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--imports", action="store_true", help="also list each command's costliest imports")
    p.add_argument("--stages", action="store_true", help="also time the stages of an `hfai status ID`")
    p.add_argument("--rev", action="append", default=[], help="also time `hfai ps` and `hfai status ID` as this "
                   "commit has them (repeatable)")
    args = p.parse_args()
    base = Path(tempfile.mkdtemp(prefix="hfai-bench-cli-"))
    cluster = LocalCluster(root=base / "cluster", nodes=1)
    try:
        cluster.up()
        cluster.wait_ready()
        # An installed package has its bytecode compiled (pip does it); a checkout run with
        # PYTHONDONTWRITEBYTECODE would compile every hfai module from source on every call.
        env = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_NATS_") and k != "PYTHONDONTWRITEBYTECODE"}
        env["HFAI_CONFIG"] = str(cluster.config_path)
        job = submit_one(cluster, base)
        hfai = [sys.executable, "-m", "hfai.cli.main"]
        load = os.getloadavg()[0]
        cases = [("python -c pass", [sys.executable, "-c", "pass"]), ("hfai --help", [*hfai, "--help"]),
                 ("hfai ps", [*hfai, "ps"]), ("hfai status ID", [*hfai, "status", job])]
        envs = {label: env for label, _ in cases}
        for rev in args.rev:
            site = package_at(rev, base / "rev" / rev)
            at = {**env, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])}
            for label, cmd in (("hfai ps", [*hfai, "ps"]), ("hfai status ID", [*hfai, "status", job])):
                cases.append((f"{label} @{rev[:10]}", cmd))
                envs[cases[-1][0]] = at
        times: dict[str, list[float]] = {label: [] for label, _ in cases}
        cpu: dict[str, list[float]] = {label: [] for label, _ in cases}
        for i in range(args.runs + 1):  # the first warms the page cache and the .pyc files: not counted
            for label, cmd in cases:
                wall, used = timed_run(cmd, envs[label])
                if i:
                    times[label].append(wall)
                    cpu[label].append(used)
        floor = statistics.median(times["python -c pass"])
        print(f"hfai CLI wall time as whole processes, local cluster, {args.runs} runs each (median, min-max; "
              f"median CPU); load average {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end, on "
              f"{os.cpu_count()} cores")
        for label, cmd in cases:
            med, lo, hi = statistics.median(times[label]), min(times[label]), max(times[label])
            line = f"  {label:<26} {med * 1000:7.1f} ms  ({lo * 1000:.0f}-{hi * 1000:.0f})  cpu " \
                   f"{statistics.median(cpu[label]) * 1000:5.1f} ms"
            if label != "python -c pass":
                line += f"   ratio to the {TARGET_S:.2f} s target {med / TARGET_S:5.2f}   to python -c pass " \
                        f"{med / floor:5.2f}"
            print(line)
            if args.imports and label != "python -c pass":
                print("      " + ", ".join(f"{name} {us / 1000:.0f} ms" for us, name in top_imports(cmd, envs[label])))
        if args.stages:
            rows = stages(["status", job], env, args.runs)
            print(f"hfai status ID after the interpreter's start, by stage (median of {args.runs} processes):")
            for what, ms in rows:
                print(f"  {ms:6.1f} ms  {what}")
            print(f"  {sum(ms for _, ms in rows):6.1f} ms  in all")
    finally:
        cluster.down()
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
