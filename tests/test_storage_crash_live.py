"""The real ``hfai-storage`` killed with SIGKILL during a commit, on a live local cluster (issue 26
§3): the workspace is the old tree or the new one, never a mix; the pushing CLI says within seconds
that the service stopped answering; the restarted service leaves no temporary file; a retried push
succeeds, also when the push only moved content between files."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest
from spine_cluster import Cluster

from hfai.core.config import StorageConfig
from hfai.storage.commit import FAULT_ENV, NEXT_PREFIX, TMP_SUFFIX

pytestmark = pytest.mark.slow

CHUNK = 64 * 1024
FILES = 300
SIZE = 10_000  # 300 files, 3 MB


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("storage-crash"), nodes=0)
    c.local.storage = StorageConfig(chunk_bytes=CHUNK, request_bytes=2 * CHUNK, scan_interval_s=3600.0,
                                    gc_interval_s=3600.0)
    with c:
        yield c


def _restart_storage(cluster: Cluster, monkeypatch, fault: str | None) -> None:
    if cluster.local.alive().get("storage"):
        cluster.local.kill("storage")
    if fault:
        monkeypatch.setenv(FAULT_ENV, fault)
    else:
        monkeypatch.delenv(FAULT_ENV, raising=False)
    cluster.local.start_storage()
    monkeypatch.delenv(FAULT_ENV, raising=False)
    cluster.wait(lambda: cluster.cli("workspace", "list").returncode == 0, 30, "the storage service to answer")


def _tree(root: Path, blobs: list[bytes]) -> dict[str, bytes]:
    files = {f"d{i % 7}/f{i:05d}": b for i, b in enumerate(blobs)}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def _view(base: Path) -> dict[str, bytes]:
    return {str(p.relative_to(base)): p.read_bytes() for p in base.rglob("*") if p.is_file()}


def _leftovers(cluster: Cluster) -> list[str]:
    user_dir = cluster.local.root / "workspaces" / "tester"
    return [str(p) for p in user_dir.glob(NEXT_PREFIX + "*")] + [str(p) for p in user_dir.rglob("*" + TMP_SUFFIX)]


def _push_in_background(cluster: Cluster, ws: Path) -> subprocess.Popen:
    return cluster.cli_popen("workspace", "push", cwd=ws, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def _expect_clear_death(proc: subprocess.Popen, killed_at: float, how: str = "it is not running") -> float:
    """The push CLI ends on its own with the dead-service message; returns how long it took after
    the kill (a bound, not a timing assertion: the old client waited out commit_timeout_s, 600 s)."""
    try:
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    took = time.monotonic() - killed_at
    assert proc.returncode == 1, err
    assert "storage service stopped answering while committing" in err and "Traceback" not in err, err
    assert f"({how})" in err, err
    assert "Push again" in err
    print(f"push CLI gave up {took:.2f}s after the service was {'killed' if 'not' in how else 'stopped'}")
    return took


def test_killed_after_the_swap_the_moved_content_push_is_whole_and_retries(cluster, tmp_path, monkeypatch):
    """Deterministic: the service stops itself (SIGSTOP, HFAI_STORAGE_FAULT) right after swapping
    the new tree in, is killed with SIGKILL there; v2 only moved content between files."""
    rnd = random.Random(1)
    ws = tmp_path / "moved"
    blobs = [rnd.randbytes(SIZE) for _ in range(FILES)]
    v1 = _tree(ws, blobs)
    assert cluster.cli("workspace", "init", cwd=ws).returncode == 0
    assert cluster.cli("workspace", "push", cwd=ws).returncode == 0
    remote = cluster.local.root / "workspaces" / "tester" / "moved"
    assert _view(remote) == v1
    v2 = _tree(ws, blobs[1:] + blobs[:1])  # every file gets its neighbour's content: no new chunk
    _restart_storage(cluster, monkeypatch, "swapped")
    proc = _push_in_background(cluster, ws)
    try:
        pid = cluster.local.pids["storage"]
        cluster.wait(lambda: _stopped(pid), 60, "the service to stop mid-commit", poll=0.02)
        assert _view(remote) == v2  # swapped in whole, though the service has not finished
        cluster.local.kill("storage")
        _expect_clear_death(proc, time.monotonic())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert _view(remote) == v2 and _leftovers(cluster)  # the old tree waits beside it until restart
    _restart_storage(cluster, monkeypatch, None)
    assert _view(remote) == v2 and not _leftovers(cluster)
    r = cluster.cli("workspace", "push", cwd=ws)
    assert r.returncode == 0, r.stderr
    # Recovery recorded the manifest it finished, so the retry finds the workspace already as pushed.
    assert "is up to date" in r.stdout and _view(remote) == v2


def test_a_real_kill_mid_commit_leaves_v1_or_v2_and_a_retry_succeeds(cluster, tmp_path, monkeypatch):
    """Not staged: SIGKILL as soon as a commit is seen under way on disk; v2 rewrites every file."""
    rnd = random.Random(2)
    ws = tmp_path / "rewritten"
    v1 = _tree(ws, [rnd.randbytes(SIZE) for _ in range(FILES)])
    assert cluster.cli("workspace", "init", cwd=ws).returncode == 0
    assert cluster.cli("workspace", "push", cwd=ws).returncode == 0
    remote = cluster.local.root / "workspaces" / "tester" / "rewritten"
    v2 = _tree(ws, [rnd.randbytes(SIZE) for _ in range(FILES)])
    proc = _push_in_background(cluster, ws)
    try:
        cluster.wait(lambda: _leftovers(cluster), 60, "a commit under way", poll=0.002)
        cluster.local.kill("storage")
        killed_at = time.monotonic()
        seen = _view(remote)
        assert seen in (v1, v2), f"{sum(seen.get(k) == v for k, v in v2.items())} of {FILES} files are v2"
        _expect_clear_death(proc, killed_at)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _restart_storage(cluster, monkeypatch, None)
    assert _view(remote) in (v1, v2) and not _leftovers(cluster)
    r = cluster.cli("workspace", "push", cwd=ws)
    assert r.returncode == 0, r.stderr
    assert _view(remote) == v2


def test_a_file_a_job_rewrote_does_not_block_a_push(cluster, tmp_path):
    """A job rewrote a pushed file in place (same size); the next push moves content between files,
    so the commit wants that file's old chunks: one `hfai workspace push` notices, sends them, and
    succeeds (it used to fail with "changed on the cluster … push again" at every try)."""
    rnd = random.Random(3)
    ws = tmp_path / "edited"
    blobs = [rnd.randbytes(SIZE) for _ in range(20)]
    _tree(ws, blobs)
    assert cluster.cli("workspace", "init", cwd=ws).returncode == 0
    assert cluster.cli("workspace", "push", cwd=ws).returncode == 0
    remote = cluster.local.root / "workspaces" / "tester" / "edited"
    (remote / "d1" / "f00001").write_bytes(bytes(SIZE))  # the job's edit
    v2 = _tree(ws, blobs[1:] + blobs[:1])
    r = cluster.cli("workspace", "push", cwd=ws)
    assert r.returncode == 0, r.stderr
    assert _view(remote) == v2 and not _leftovers(cluster)


def test_a_hung_service_is_reported_and_its_unswapped_commit_undone(cluster, tmp_path, monkeypatch):
    """The service stops (SIGSTOP) with the new tree built but not swapped in: the CLI says it is
    hung within [nats] request_timeout_s and a second; killed and restarted, the workspace is v1
    exactly and the retried push makes it v2."""
    rnd = random.Random(4)
    ws = tmp_path / "hung"
    v1 = _tree(ws, [rnd.randbytes(SIZE) for _ in range(50)])
    assert cluster.cli("workspace", "init", cwd=ws).returncode == 0
    assert cluster.cli("workspace", "push", cwd=ws).returncode == 0
    remote = cluster.local.root / "workspaces" / "tester" / "hung"
    v2 = _tree(ws, [rnd.randbytes(SIZE) for _ in range(50)])
    _restart_storage(cluster, monkeypatch, "built")
    proc = _push_in_background(cluster, ws)
    try:
        pid = cluster.local.pids["storage"]
        cluster.wait(lambda: _stopped(pid), 60, "the service to stop mid-commit", poll=0.02)
        _expect_clear_death(proc, time.monotonic(), how="it is hung or cut off from NATS")
        assert _view(remote) == v1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _restart_storage(cluster, monkeypatch, None)
    assert _view(remote) == v1 and not _leftovers(cluster)
    r = cluster.cli("workspace", "push", cwd=ws)
    assert r.returncode == 0, r.stderr
    assert _view(remote) == v2
