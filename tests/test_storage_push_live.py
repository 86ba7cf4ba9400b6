"""`hfai workspace push` on a live local cluster: --dry-run lists what would move and changes
nothing (no chunk staged, the cluster's copy as before), and the progress bar shows bytes, rate
and time left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from spine_cluster import Cluster

from hfai.config import StorageConfig

pytestmark = pytest.mark.slow

CHUNK = 64 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("push"), nodes=1)
    c.local.storage = StorageConfig(chunk_bytes=CHUNK, request_bytes=2 * CHUNK, gc_interval_s=3600.0)
    with c:
        yield c


def _staged(cluster: Cluster) -> list[Path]:
    d = cluster.local.root / "workspaces" / ".hfai-staging" / "tester"
    return sorted(d.glob("*.pack")) if d.is_dir() else []


def test_dry_run_lists_what_would_move_and_changes_nothing(cluster, tmp_path):
    ws = tmp_path / "dry"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("print('a')\n")
    (ws / "big.bin").write_bytes(os.urandom(3 * CHUNK))
    assert cluster.cli("workspace", "init", cwd=ws).returncode == 0
    first = cluster.cli("workspace", "push", cwd=ws)
    assert first.returncode == 0, first.stderr
    # The progress bar: bytes done of the total, a rate and the time left (tqdm's format).
    assert "B/s" in first.stderr and "100%" in first.stderr
    remote = cluster.local.root / "workspaces" / "tester" / "dry"
    (ws / "src" / "a.py").write_text("print('changed')\n")
    (ws / "new.txt").write_text("new\n")
    r = cluster.cli("workspace", "push", "--dry-run", cwd=ws)
    assert r.returncode == 0, r.stderr
    listed = [line.split()[-1] for line in r.stdout.splitlines() if "chunk(s)" in line and "would send" not in line]
    assert listed == ["new.txt", "src/a.py"]  # big.bin is already there
    assert "would send 2 of 5 chunks" in r.stdout and "dry run: nothing sent" in r.stdout
    assert _staged(cluster) == [] and (remote / "src" / "a.py").read_text() == "print('a')\n"
    assert not (remote / "new.txt").exists()
    # The real push then moves exactly those.
    again = cluster.cli("workspace", "push", cwd=ws)
    assert again.returncode == 0 and "sent 2 of 5 chunks" in again.stdout
    assert (remote / "src" / "a.py").read_text() == "print('changed')\n"
