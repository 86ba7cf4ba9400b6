"""The time-sharing demo (`make demo`): a local cluster where a job is preempted and resumes.

1. start a 2-node local cluster (NATS, a controller, 2 agents with 8 simulated GPUs each);
2. submit a LOW-priority 2-node training job; let it train;
3. submit a HIGH-priority 2-node job: the first is asked to suspend, checkpoints, acknowledges
   and waits in the queue; the urgent job runs and finishes;
4. the first job resumes from its checkpoint and finishes; `hfai ps`, `status`, `logs` show it.

Every step is a real `hfai` command, printed before it runs. State lives in a fresh directory
(printed at the start), so the demo never touches an existing ~/.hfai; it is removed when the demo
ends, also when it fails or is stopped with Ctrl-C or SIGTERM, since it holds the demo cluster's
issuer seeds and credentials (HFAI_DEMO_KEEP=1 keeps it to look at).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAIN = str(REPO / "examples" / "train.py")
# The demo's HFAI_HOME, the folder its commands run in (the jobs' workdir: in a compute container,
# the workdir and the user's home are what persists between runs, so the checkpoints go there)
# and their environment, set by main() (nothing at import).
HOME = Path()
WORK = Path()
ENV: dict[str, str] = {}


@contextlib.contextmanager
def temporary_home(keep: bool = False) -> Iterator[Path]:
    """A fresh HFAI_HOME, removed on the way out however the demo ends (an exception, Ctrl-C, or
    SIGTERM, which is turned into SystemExit so that this cleanup runs)."""
    home = Path(tempfile.mkdtemp(prefix="hfai-demo-"))
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield home
    finally:
        signal.signal(signal.SIGTERM, previous)
        if keep:
            print(f"kept the demo's state in {home} (HFAI_DEMO_KEEP)", flush=True)
        else:
            shutil.rmtree(home, ignore_errors=True)
            if home.exists():
                print(f"could not remove all of {home}: remove it by hand", file=sys.stderr, flush=True)


def _exit_on_sigterm(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def hfai(*args: str, show: bool = True, check: bool = True) -> str:
    if show:
        print(f"\n$ hfai {' '.join(args)}", flush=True)
    r = subprocess.run([sys.executable, "-m", "hfai.cli.main", *args], cwd=WORK, env=ENV, capture_output=True,
                       text=True)
    if show:
        print((r.stdout + r.stderr).rstrip(), flush=True)
    if check and r.returncode != 0:
        raise SystemExit(f"demo failed: `hfai {' '.join(args)}` exited {r.returncode}")
    return r.stdout


def state_of(name: str) -> tuple[str, int]:
    out = hfai("status", name, show=False)
    state = re.search(r"^state\s+(\w+)", out, re.M).group(1)
    suspends = int(re.search(r"suspended (\d+) times", out).group(1))
    return state, suspends


def wait_for(name: str, states: set[str], timeout: float = 240.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state, _ = state_of(name)
        if state in states:
            return state
        if state in {"failed", "stopped"}:
            raise SystemExit(f"demo failed: {name} is {state}")
        time.sleep(0.5)
    raise SystemExit(f"demo failed: {name} did not reach {states} in {timeout:.0f}s")


def wait_log(name: str, pattern: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if re.search(pattern, hfai("logs", name, show=False, check=False)):
            return
        time.sleep(0.5)
    raise SystemExit(f"demo failed: {name} never printed {pattern!r}")


def main() -> int:
    global HOME, WORK, ENV
    with temporary_home(keep=os.environ.get("HFAI_DEMO_KEEP") == "1") as home:
        HOME, WORK = home, home / "work"
        WORK.mkdir()
        # You, as the login name says: `hfai local up` issues your (operator) credentials for it.
        ENV = dict(os.environ, HFAI_HOME=str(HOME))
        ENV.pop("HFAI_CONFIG", None)
        print(f"hfai demo: task-level time-sharing on a local 2-node cluster (state in {HOME})", flush=True)
        try:
            hfai("local", "up", "--nodes", "2")
            run_demo(Path("checkpoints"))  # in the workdir
        finally:
            hfai("local", "down", check=False)
    return 0


def run_demo(ckpt: Path) -> None:
    """The demo's steps on the running cluster; SystemExit if something did not happen."""
    hfai("nodes")
    print("\n# A long, low-priority pre-training job takes both nodes.")
    hfai("python", TRAIN, "--steps", "80", "--step-time", "0.15", "--ckpt-dir", str(ckpt / "pretrain"),
         "--", "-n", "2", "--name", "pretrain", "-p", "LOW")
    wait_for("pretrain", {"running"})
    wait_log("pretrain", r"step 20 ")
    hfai("ps")
    print("\n# An urgent evaluation arrives at HIGH priority: it preempts the pre-training job.")
    hfai("python", TRAIN, "--steps", "20", "--step-time", "0.1", "--ckpt-dir", str(ckpt / "urgent"),
         "--", "-n", "2", "--name", "urgent-eval", "-p", "HIGH")
    wait_for("pretrain", {"suspending", "suspended"}, timeout=60)
    hfai("ps")
    wait_for("pretrain", {"suspended"}, timeout=60)
    print("\n# pretrain saved a checkpoint, acknowledged, and waits in the queue.")
    hfai("ps")
    hfai("nodes")
    wait_for("urgent-eval", {"succeeded"})
    print("\n# urgent-eval is done; pretrain resumes from its checkpoint.")
    wait_for("pretrain", {"running", "succeeded"})
    hfai("ps")
    wait_for("pretrain", {"succeeded"})
    hfai("ps", "-a")
    hfai("status", "pretrain")
    log = hfai("logs", "pretrain")
    _, suspends = state_of("pretrain")
    saved = re.search(r"checkpoint saved at step (\d+)", log)
    resumed = re.search(r"resumed from step (\d+)", log)
    if suspends < 1 or not saved or not resumed or "done after 80 steps" not in log:
        raise SystemExit("demo failed: the preempt/checkpoint/resume cycle did not show in the logs")
    print(f"\nOK: pretrain was preempted {suspends} time(s), checkpointed at step {saved.group(1)}, "
          f"resumed from step {resumed.group(1)} and finished all 80 steps.")


if __name__ == "__main__":
    sys.exit(main())
