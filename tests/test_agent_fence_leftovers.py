"""Nothing a run started outlives it (issue 26 §6), checked against the process table: whether the
job exits by itself or is stopped, with or without self-fencing, a child that ignores SIGTERM in
the job's group and a daemon that left it (setsid, double fork) are gone once the launcher has
recorded the exit status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from waits import wait_for_file

from hfai.agent.launcher import LAUNCH_FILE
from hfai.agent.launchspec import Fencing, LaunchSpec

# Leaves two processes behind, both marked by argv[2] in their command lines: one in its group
# that ignores SIGTERM, one that left the group by a double fork and setsid. Writes
# "<pid> <child> <daemon>" once both run, then exits 0 once the file "<argv[1]>.go" exists, or
# waits for a SIGTERM (argv[3] == "wait").
LEAVER = r"""
import os, subprocess, sys, time
out, mark, how = sys.argv[1], sys.argv[2], sys.argv[3]
stubborn = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(120)", mark])
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)", mark])
    os._exit(0)
os.wait()
daemon = None
deadline = time.monotonic() + 10
# Not this process either: its own command line holds the mark too, and a scan that reads the
# daemon's while it execs (empty for a moment) would otherwise take this one for it.
while daemon is None and time.monotonic() < deadline:
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and int(p) not in (stubborn.pid, os.getpid()) \
                    and mark in open(f"/proc/{p}/cmdline").read():
                daemon = int(p)
        except OSError:
            pass
    time.sleep(0.01)
with open(out + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {stubborn.pid} {daemon}")
os.replace(out + ".tmp", out)
while how == "wait" or not os.path.exists(out + ".go"):  # "wait": until a SIGTERM; else until told
    time.sleep(0.01)
"""


def _marked(mark: str) -> list[int]:
    """Live processes (not zombies) whose command line holds ``mark``."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and mark in (p.info["cmdline"] or []):
            out.append(p.pid)
    return out


def _launch(tmp_path: Path, how: str, fence: bool) -> tuple[subprocess.Popen, Path, Path, str]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    logf = tmp_path / "job.log"
    logf.touch()
    pids = tmp_path / "pids"
    mark = f"hfai-leftover-{os.getpid()}-{time.monotonic_ns()}"
    fencing = None
    if fence:  # the launcher's polling loop; the stamp stays fresh for the whole test
        alive = tmp_path / "alive"
        alive.write_text(f"{time.monotonic() + 3600:.6f}\n")
        fencing = Fencing(alive=str(alive), fence_s=60.0, kill_s=90.0, poll_s=0.1)
    spec = LaunchSpec(argv=(sys.executable, "-c", LEAVER, str(pids), mark, how), env=dict(os.environ),
                      cwd=str(tmp_path), log=str(logf), log_cap=0, fence=fencing)
    (run_dir / LAUNCH_FILE).write_bytes(spec.to_json())
    launcher = subprocess.Popen([sys.executable, "-m", "hfai.agent.launcher", str(run_dir)],
                                stdin=subprocess.DEVNULL, start_new_session=True)
    return launcher, run_dir, pids, mark


@pytest.mark.parametrize("fence", [False, True], ids=["no-fence", "fence"])
@pytest.mark.parametrize("how", ["exits", "stopped"])
def test_no_process_of_a_run_outlives_it(tmp_path, how, fence):
    launcher, run_dir, pids, mark = _launch(tmp_path, "exit" if how == "exits" else "wait", fence)
    try:
        job, stubborn, daemon = (int(p) for p in wait_for_file(pids).split())
        assert {stubborn, daemon} <= set(_marked(mark)), "the job did not leave its two processes"
        assert os.getpgid(daemon) != job  # it did leave the job's group
        if how == "stopped":
            os.killpg(job, signal.SIGTERM)  # what the agent does to stop a run
        else:
            pids.with_name("pids.go").touch()
        launcher.wait(30)
        expected = "0" if how == "exits" else str(-signal.SIGTERM)
        assert (run_dir / "exit_code").read_text().strip() == expected
        # Checked the moment the status exists: the run is over for the agent then.
        assert _marked(mark) == [], "processes of the run outlived it"
        assert "killed 2 process(es) the job left running" in (tmp_path / "job.log").read_text()
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
