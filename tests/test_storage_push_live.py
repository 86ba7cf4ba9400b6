"""`hfai workspace push` on a live local cluster: --dry-run lists what would move and changes
nothing (no chunk staged, the cluster's copy as before), and the progress bar shows bytes, rate
and time left."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from spine_cluster import Cluster

from hfai.core.config import StorageConfig

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
    # Packs, and one-chunk files staged whole (storage/staging.py).
    return sorted([*d.glob("*.pack"), *d.glob("*/*.one")]) if d.is_dir() else []


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


def test_the_local_cluster_lets_a_push_send_its_configured_request_size(cluster):
    from hfai.storage.client import StorageClient

    cluster.creds("tester")

    async def sizes(api) -> tuple[int, int]:
        client = StorageClient(api=api)  # around the same authenticated connection
        return api._nc.max_payload, client.request_size(StorageConfig().request_bytes)

    announced, size = cluster.run(sizes)
    # Its nats-server announces 8 MiB (cli/local/nats_server.py), so a push moves the whole 4 MiB
    # of [storage] request_bytes a request (against a 1 MiB server: test_storage_push.py).
    assert announced == 8 * 1024 * 1024 and size == StorageConfig().request_bytes


def test_an_unchanged_push_asks_one_question_and_commits_nothing(cluster, tmp_path):
    ws = tmp_path / "same"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "a.py").write_text("print('a')\n")
    (ws / "big.bin").write_bytes(os.urandom(3 * CHUNK + 5))
    assert cluster.cli("workspace", "init", cwd=ws).returncode == 0
    assert cluster.cli("workspace", "push", cwd=ws).returncode == 0
    remote = cluster.local.root / "workspaces" / "tester" / "same"
    manifest = cluster.local.root / "storage" / "manifests" / "tester" / "same.manifest"
    index = ws / ".hfai" / "pushed.json"
    before = (manifest.stat().st_mtime_ns, index.stat().st_mtime_ns)
    r = cluster.cli("workspace", "push", cwd=ws)
    assert r.returncode == 0, r.stderr
    assert "same is up to date: 2 files" in r.stdout and "chunk(s) to send" not in r.stderr
    # No commit recorded a manifest, and the local index (unchanged) was not rewritten.
    assert (manifest.stat().st_mtime_ns, index.stat().st_mtime_ns) == before
    # What the cluster's copy lost is no longer "up to date": a file removed there, or cut short,
    # is sent again by the next push.
    (remote / "src" / "a.py").unlink()
    r = cluster.cli("workspace", "push", cwd=ws)
    assert r.returncode == 0 and "pushed same" in r.stdout and "sent 1 of 5 chunks" in r.stdout, r.stdout
    assert (remote / "src" / "a.py").read_text() == "print('a')\n"
    with open(remote / "big.bin", "r+b") as f:
        f.truncate(CHUNK)
    r = cluster.cli("workspace", "push", cwd=ws)
    # A file not at its size holds no chunk the service trusts: all four of big.bin go again.
    assert r.returncode == 0 and "sent 4 of 5 chunks" in r.stdout, r.stdout
    assert (remote / "big.bin").read_bytes() == (ws / "big.bin").read_bytes()
    # A local change is not up to date either: new content, or only a new mode.
    (ws / "src" / "a.py").write_text("print('b')\n")
    r = cluster.cli("workspace", "push", cwd=ws)
    assert r.returncode == 0 and "sent 1 of 5 chunks" in r.stdout, r.stdout
    os.chmod(ws / "src" / "a.py", 0o600)
    r = cluster.cli("workspace", "push", cwd=ws)
    assert r.returncode == 0 and "pushed same" in r.stdout and "sent 0 of 5 chunks" in r.stdout, r.stdout
    assert (remote / "src" / "a.py").stat().st_mode & 0o777 == 0o600
    assert " is up to date: " in cluster.cli("workspace", "push", cwd=ws).stdout
