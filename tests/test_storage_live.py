"""Workspaces and storage rules on a live local cluster (nats-server, controller, agent, hfai-storage,
credentials): push with .hfignore, one changed byte moves one chunk, a killed push resumes, a job
runs in the pushed copy, a user over the limit is restricted and refused, and restored after
cleaning up. One cluster for the module."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
from pathlib import Path

import pytest
from spine_cluster import Cluster

from hfai.core.config import StorageConfig
from hfai.protocol.types import ChainState

pytestmark = pytest.mark.slow

CHUNK = 64 * 1024
LIMIT = 6_000_000  # tester stays under it (~4 MB), bob goes over


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("storage"), nodes=1)
    c.local.storage = StorageConfig(chunk_bytes=CHUNK, request_bytes=2 * CHUNK, limit_bytes=LIMIT,
                                    scan_interval_s=0.5, gc_interval_s=3600.0)
    with c:
        yield c


def _push(cluster: Cluster, ws: Path, user: str = "tester", *extra: str) -> str:
    r = cluster.cli("workspace", "push", *extra, cwd=ws, user=user)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _sent(out: str) -> tuple[int, int]:
    words = out.split("sent ", 1)[1].split()
    return int(words[0]), int(words[2])


def test_push_ignores_and_moves_only_changed_chunks(cluster, tmp_path):
    ws = tmp_path / "proj"
    ws.mkdir()
    (ws / ".hfignore").write_text("*.log\ncache/\n")
    (ws / "train.py").write_text("print('hi')\n")
    (ws / "run.log").write_text("not pushed")
    (ws / "cache").mkdir()
    (ws / "cache" / "x").write_text("not pushed")
    big = os.urandom(20 * CHUNK)
    (ws / "big.bin").write_bytes(big)
    assert cluster.cli("workspace", "init", "proj", cwd=ws).returncode == 0
    sent, total = _sent(_push(cluster, ws))
    assert sent == total == 22  # 20 chunks of big.bin, train.py, .hfignore
    remote = cluster.local.root / "workspaces" / "tester" / "proj"
    assert sorted(p.name for p in remote.iterdir()) == [".hfignore", "big.bin", "train.py"]
    assert (remote / "big.bin").read_bytes() == big
    # One byte changed in the middle of the large file: exactly one chunk moves.
    changed = bytearray(big)
    changed[7 * CHUNK + 5] ^= 0xFF
    (ws / "big.bin").write_bytes(bytes(changed))
    assert _sent(_push(cluster, ws)) == (1, 22)
    assert (remote / "big.bin").read_bytes() == bytes(changed)
    assert " is up to date: " in _push(cluster, ws)  # nothing changed: nothing moves
    # Pull it back elsewhere.
    r = cluster.cli("workspace", "pull", "proj", str(tmp_path / "back"), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "back" / "big.bin").read_bytes() == bytes(changed)
    listed = cluster.cli("workspace", "list", cwd=ws)
    assert "proj" in listed.stdout and str(remote) in listed.stdout


def _staged_chunks(cluster: Cluster) -> int:
    """Chunks staged for tester (storage/staging.py): in packs, in part files (a line each in
    their .idx), or whole."""
    from hfai.storage.staging import parse_description

    staged = cluster.local.root / "workspaces" / ".hfai-staging" / "tester"
    if not staged.is_dir():
        return 0
    n = sum(len(parse_description(p.open("rb").readline().decode())) for p in staged.glob("*.pack"))
    n += sum(len(p.read_bytes().splitlines()) for p in staged.glob("*/*.part.idx"))
    return n + len(list(staged.glob("*/*.one")))


def test_a_killed_push_resumes(cluster, tmp_path):
    ws = tmp_path / "resume"
    ws.mkdir()
    data = os.urandom(40 * CHUNK)
    (ws / "weights.bin").write_bytes(data)
    assert cluster.cli("workspace", "init", cwd=ws).returncode == 0
    before = _staged_chunks(cluster)
    # 40 chunks at 256 KB/s: ~10 s; killed once a few chunks are staged. A new file, it is sent
    # unhashed; the journal lists it before its first put, so the next push hashes it and sends
    # only the chunks the cluster lacks.
    proc = cluster.cli_popen("workspace", "push", "--bwlimit", "256", cwd=ws, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        cluster.wait(lambda: _staged_chunks(cluster) >= before + 4, 30, "part of the push to be staged", poll=0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    begun = [json.loads(line) for line in (ws / ".hfai" / "sent.jsonl").read_text().splitlines()]
    assert [(b[0], b[1], b[3]) for b in begun] == [("weights.bin", len(data), [])]
    sent, total = _sent(_push(cluster, ws))
    assert total == 40 and 0 < sent < 40
    target = cluster.local.root / "workspaces" / "tester" / "resume" / "weights.bin"
    assert target.read_bytes() == data and target.stat().st_nlink == 1
    assert not list((cluster.local.root / "workspaces" / ".hfai-staging" / "tester").glob("*/*.part*"))


def test_a_killed_push_of_new_small_files_resumes_without_sending_them_again(cluster, tmp_path):
    """New files of one chunk go unhashed, the service naming each as it takes it; the journal of
    those names outlives a kill, so the next push sends only the files not answered before it."""
    ws = tmp_path / "smallresume"
    ws.mkdir()
    files = {f"f{i:02d}.bin": os.urandom(CHUNK // 4 - i) for i in range(40)}  # 8 a put, 4 puts a second
    for rel, data in files.items():
        (ws / rel).write_bytes(data)
    assert cluster.cli("workspace", "init", cwd=ws).returncode == 0
    journal = ws / ".hfai" / "sent.jsonl"
    proc = cluster.cli_popen("workspace", "push", "--bwlimit", "256", cwd=ws, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    try:
        cluster.wait(lambda: journal.exists() and len(journal.read_bytes().splitlines()) >= 4, 30,
                     "part of the push to be answered", poll=0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    answered = len(journal.read_bytes().splitlines())
    sent, total = _sent(_push(cluster, ws))
    assert total == 40 and sent <= 40 - answered and sent > 0
    remote = cluster.local.root / "workspaces" / "tester" / "smallresume"
    assert {p.name: p.read_bytes() for p in remote.iterdir()} == files
    assert not journal.exists()  # the commit's local index holds them now
    assert " is up to date: " in _push(cluster, ws)
    assert cluster.cli("workspace", "remove", "smallresume", cwd=ws).returncode == 0  # tester stays under LIMIT


def test_a_job_runs_in_the_pushed_copy(cluster, tmp_path):
    ws = tmp_path / "jobws"
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "show.py").write_text(textwrap.dedent("""
        import os
        print("CWD", os.getcwd(), "DATASETS", os.environ.get("HFAI_DATASETS_DIR"), flush=True)
        print("DATA", open("input.txt").read(), flush=True)
    """))
    (ws / "sub" / "input.txt").write_text("from-the-workspace")
    assert cluster.cli("workspace", "init", "jobws", cwd=ws).returncode == 0
    _push(cluster, ws)
    (ws / "sub" / "input.txt").write_text("local edit, not pushed")
    r = cluster.cli("python", "show.py", "--", "-n", "1", "--name", "wsjob", cwd=ws / "sub")
    assert r.returncode == 0, r.stderr
    remote = cluster.local.root / "workspaces" / "tester" / "jobws" / "sub"
    job = cluster.wait_state("wsjob", ChainState.SUCCEEDED)
    assert job.spec.workdir == str(remote)
    log = cluster.log(job.id)
    assert f"CWD {remote}" in log and "DATA from-the-workspace" in log
    # In its compute container the datasets are at the user guide's /public_dataset.
    assert "DATASETS /public_dataset" in log


def test_over_the_limit_restricts_until_cleaned_up(cluster, tmp_path):
    ws = tmp_path / "hog"
    ws.mkdir()
    (ws / "blob").write_bytes(os.urandom(LIMIT + CHUNK))
    assert cluster.cli("workspace", "init", cwd=ws, user="bob").returncode == 0
    _push(cluster, ws, "bob")

    def refused():
        r = cluster.cli("submit", "--name", "nope", "true", cwd=tmp_path, user="bob")
        return r if r.returncode != 0 else None

    r = cluster.wait(refused, 30, "bob's submission to be refused")
    assert "restricted" in r.stderr and "Traceback" not in r.stderr
    usage = cluster.cli("workspace", "usage", cwd=ws, user="bob")
    assert "RESTRICTED" in usage.stdout
    still = cluster.cli("workspace", "restore-request", cwd=ws, user="bob")
    assert still.returncode != 0 and "still over the limit" in still.stderr
    assert cluster.cli("workspace", "remove", "hog", cwd=ws, user="bob").returncode == 0
    lifted = cluster.cli("workspace", "restore-request", cwd=ws, user="bob")
    assert lifted.returncode == 0, lifted.stderr
    assert "not restricted" in lifted.stdout
    r = cluster.cli("submit", "--name", "ok", "true", cwd=tmp_path, user="bob")
    assert r.returncode == 0, r.stderr
    cluster.wait_state("ok", ChainState.SUCCEEDED)


def test_another_users_workspace_is_out_of_reach(cluster, tmp_path):
    """Users act only as themselves: removing or pulling 'proj' as bob names bob's own workspaces."""
    r = cluster.cli("workspace", "pull", "proj", str(tmp_path / "x"), cwd=tmp_path, user="bob")
    assert r.returncode != 0 and "no workspace 'proj'" in r.stderr
    r = cluster.cli("workspace", "remove", "proj", cwd=tmp_path, user="bob")
    assert r.returncode != 0
    assert (cluster.local.root / "workspaces" / "tester" / "proj" / "big.bin").exists()


PATIENT = """
import os, sys, time, hfai
if int(os.environ.get("HFAI_SUSPEND_COUNT", "0")) > 0:
    print("RESUMED", flush=True)
    sys.exit(0)
for _ in range(600):
    if hfai.receive_suspend_command():
        print("CHECKPOINT", flush=True)
        hfai.go_suspend()
    time.sleep(0.1)
"""


def test_a_restricted_users_running_job_is_suspended_and_resumes(cluster, tmp_path):
    """Storage rules and scheduler together: over the limit, carol's running job checkpoints and is
    suspended (controller/plan.py holds restricted users' jobs); cleaned up and restored, it resumes."""
    ws = tmp_path / "carolws"
    ws.mkdir()
    (ws / "patient.py").write_text(PATIENT)
    assert cluster.cli("workspace", "init", cwd=ws, user="carol").returncode == 0
    _push(cluster, ws, "carol")
    r = cluster.cli("python", "patient.py", "--", "-n", "1", "--name", "patient", cwd=ws, user="carol")
    assert r.returncode == 0, r.stderr
    job = cluster.run(lambda api: api.status("patient"), user="carol")
    try:
        cluster.wait(lambda: cluster.run(lambda api: api.status(job.id), user="carol").state is ChainState.RUNNING,
                     30, "carol's job to run")
        (ws / "blob").write_bytes(os.urandom(LIMIT + CHUNK))
        _push(cluster, ws, "carol")
        cluster.wait(lambda: cluster.run(lambda api: api.status(job.id), user="carol").state is ChainState.SUSPENDED,
                     20, "the restricted user's job to be suspended")
        assert "CHECKPOINT" in cluster.log(job.id)
        (ws / "blob").unlink()
        _push(cluster, ws, "carol")
        assert cluster.cli("workspace", "restore-request", cwd=ws, user="carol").returncode == 0
        cluster.wait(lambda: cluster.run(lambda api: api.status(job.id), user="carol").state is ChainState.SUCCEEDED,
                     30, "the job to resume and finish")
        assert "RESUMED" in cluster.log(job.id)
    finally:
        cluster.run(lambda api: api.stop(job.id), user="carol")
        (ws / "blob").unlink(missing_ok=True)
        _push(cluster, ws, "carol")
        cluster.cli("workspace", "restore-request", cwd=ws, user="carol")


def test_an_environment_made_by_its_user_runs_jobs(cluster, tmp_path):
    r = cluster.cli("env", "create", "myenv", "--no-pip", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "myenv" in cluster.cli("env", "list", cwd=tmp_path).stdout
    again = cluster.cli("env", "create", "myenv", "--no-pip", cwd=tmp_path)
    assert again.returncode != 0 and "already exists" in again.stderr and "Traceback" not in again.stderr
    (tmp_path / "where.py").write_text("import sys; print('PREFIX', sys.prefix, flush=True)\n")
    env_dir = cluster.local.root / "envs" / "myenv"

    def offered():  # the agent offers it from its next heartbeat on
        r = cluster.cli_env({"HFAI_USER": "tester", "HF_ENV_NAME": "myenv"}, "python", "where.py", "--", "-n", "1",
                            "--name", "inenv", cwd=tmp_path)
        return r if r.returncode == 0 else None

    cluster.wait(offered, 15, "the environment to be offered and the job submitted")
    job = cluster.wait_state("inenv", ChainState.SUCCEEDED)
    assert f"PREFIX {env_dir}" in cluster.log(job.id)
    assert "=== hfai: environment myenv ===" in cluster.log(job.id)  # which one it got (issue 40)
    assert cluster.cli("env", "remove", "myenv", cwd=tmp_path).returncode == 0
    assert not env_dir.exists()


def test_a_users_environment_cannot_take_the_base_environments_stock_names(cluster, tmp_path):
    """The local cluster's interpreter is its base environment, aliased py38-202111 and 202111 (issue
    40): a user's environment of either name would hide it, and is refused in one line."""
    for stock in ("py38-202111", "202111"):
        r = cluster.cli("env", "create", stock, "--no-pip", cwd=tmp_path)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and "names the base environment" in r.stderr
        assert not (cluster.local.root / "envs" / stock).exists()


def test_a_job_switches_into_an_environment_with_hf_env(cluster, tmp_path):
    """The public scripts' first line, ``hf_env.set_env(NAME)``, finds the cluster's environments: the
    agent tells jobs where they live (HFAI_ENV_ROOT), which a job run as its submitter cannot read
    from the agent's config."""
    assert cluster.cli("env", "create", "switched", "--no-pip", cwd=tmp_path).returncode == 0
    (tmp_path / "switch.py").write_text("import os, hf_env\nhf_env.set_env('switched')\n"
                                        "print('ENV', os.environ['VIRTUAL_ENV'], flush=True)\n")
    r = cluster.cli("python", "switch.py", "--", "-n", "1", "--name", "switch", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = cluster.wait_state("switch", ChainState.SUCCEEDED)
    assert f"ENV {cluster.local.root / 'envs' / 'switched'}" in cluster.log(job.id)
    assert cluster.cli("env", "remove", "switched", cwd=tmp_path).returncode == 0
