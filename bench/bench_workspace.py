"""Workspace push against ``rsync -a`` of the same tree, in the same run, on this machine.

Three cases, each pushed with ``hfai workspace push`` to a real local cluster (nats-server,
controller, agent, hfai-storage; chunks go through JetStream's object store and the storage
service writes them into the workspace root) and copied with ``rsync -a`` to a local directory:

  * many files: 1 GB in 10,000 files;
  * one file: one 1 GB file;
  * no change: the many-files tree pushed (and rsynced) again unchanged.

Prints seconds for each and the ratio hfai/rsync (lower is better for hfai). Scale everything
down with ``HFAI_BENCH_WS_MB`` (default 1000) and ``HFAI_BENCH_WS_FILES`` (default 10000).

    python bench/bench_workspace.py            # the full 1 GB cases (several minutes here)
    HFAI_BENCH_WS_MB=50 HFAI_BENCH_WS_FILES=500 python bench/bench_workspace.py   # quick
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hfai.cli.local import LocalCluster

MB = 1_000_000


def make_tree(root: Path, total: int, files: int) -> None:
    root.mkdir(parents=True)
    per = total // files
    for i in range(files):
        d = root / f"d{i % 100:02d}"
        d.mkdir(exist_ok=True)
        (d / f"f{i:05d}.bin").write_bytes(os.urandom(per))


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    t = time.perf_counter()
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    return time.perf_counter() - t


def main() -> None:
    total = int(os.environ.get("HFAI_BENCH_WS_MB", "1000")) * MB
    nfiles = int(os.environ.get("HFAI_BENCH_WS_FILES", "10000"))
    rsync = shutil.which("rsync")
    if rsync is None:
        sys.exit("rsync is not installed: the benchmark compares against it")
    base = Path(tempfile.mkdtemp(prefix="hfai-bench-ws-"))
    cluster = LocalCluster(root=base / "cluster", nodes=1)
    try:
        cluster.up()
        cluster.wait_ready()
        env = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_NATS_")}
        env["HFAI_CONFIG"] = str(cluster.config_path)
        hfai = [sys.executable, "-m", "hfai.cli.main"]
        many, one = base / "many", base / "one"
        make_tree(many, total, nfiles)
        one.mkdir()
        with open(one / "big.bin", "wb") as f:
            for _ in range(total // MB):
                f.write(os.urandom(MB))
        (base / "rsync").mkdir()
        rows = []
        for label, tree in (("many files", many), ("one file", one), ("no change", many)):
            if label != "no change":
                timed([*hfai, "workspace", "init", tree.name], tree, env)
            t_hfai = timed([*hfai, "workspace", "push"], tree, env)
            t_rsync = timed([rsync, "-a", f"{tree}/", str(base / "rsync" / tree.name)], base, env)
            rows.append((label, t_hfai, t_rsync))
        size = f"{total / MB:.0f} MB"
        print(f"workspace push vs rsync -a, {size}; many files: {nfiles} files")
        for label, t_hfai, t_rsync in rows:
            print(f"{label:<11} hfai push {t_hfai:7.2f} s   rsync -a {t_rsync:7.2f} s   ratio hfai/rsync "
                  f"{t_hfai / t_rsync:6.2f}   ({total / MB / t_hfai:6.1f} MB/s vs {total / MB / t_rsync:6.1f} MB/s)")
    finally:
        cluster.down()
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
