"""A full state directory on a node (issue 26 §7): the agent's state on a real 2 MiB tmpfs,
filled to the last block. Runs keep their real exit status, a job printing onto the full disk is
not hurt, a run that cannot start is an interruption with the reason, and the agent drains its
node instead of dying, and undrains it once space is back. Real launchers and jobs; NATS
replaced by a recorder (the agent's decisions are what is tested here)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from waits import wait_for

from hfai.agent.launcher import read_stamp
from hfai.agent.launchers import LAUNCH_EXEC, ExecLauncher
from hfai.agent.plan import RunPhase
from hfai.agent.runs import DiskFull, RunStore
from hfai.agent.service import Agent
from hfai.core.config import AgentConfig, Config
from hfai.protocol import decode, encode
from hfai.protocol.types import DesiredRun, NodeAssignment, NodeRecord, RunAssignment, RunEventKind

WAIT_S = 60.0  # a bound on waits for a job on two shared cores, not a timing


@pytest.fixture
def state_dir(tmp_path: Path):
    """A 2 MiB tmpfs for the agent's state (root only: skipped elsewhere)."""
    mnt = tmp_path / "state"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(root: Path) -> Path:
    """Take every free block of ``root``'s filesystem; returns the filler (unlink it to free)."""
    filler = root / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 16, 4096, 1):
            try:
                while True:
                    os.write(fd, b"x" * size)
            except OSError as e:
                assert e.errno == 28, e
    finally:
        os.close(fd)
    return filler


def ra(tmp_path: Path, job_id: str, code: str = "pass") -> RunAssignment:
    return RunAssignment(job_id=job_id, run_id=1, name=job_id, user="u", group="default", priority=10, rank=0,
                         world_size=1, master_addr="127.0.0.1", master_port=20000,
                         entrypoint=(sys.executable, "-c", code), workdir=str(tmp_path), desired=DesiredRun.RUN)


def exited(store: RunStore, key: str):
    return wait_for(lambda: (r := store.snapshot().get(key)) is not None and r.phase is RunPhase.EXITED and r,
                    WAIT_S, f"{key} to exit", poll=0.02)


# Waits for the file named by argv[1], then (after printing argv[2] bytes) for argv[3], then exits 0.
WAITER = """
import os, sys, time
def wait(p):
    while not os.path.exists(p):
        time.sleep(0.02)
wait(sys.argv[1])
n = int(sys.argv[2])
while n > 0:
    sys.stdout.write("y" * min(n, 65535) + "\\n")
    n -= 65536
open(sys.argv[1] + ".printed", "w").close()
if len(sys.argv) > 3:
    wait(sys.argv[3])
    print("after the disk had room again")
"""


def waiter(tmp_path: Path, job_id: str, printed: int, then: Path | None = None) -> tuple[RunAssignment, Path]:
    go = tmp_path / f"{job_id}.go"
    r = ra(tmp_path, job_id)
    argv = (sys.executable, "-c", WAITER, str(go), str(printed), *((str(then),) if then else ()))
    return RunAssignment(**{**r.__dict__, "entrypoint": argv}), go


def test_a_run_that_ends_while_the_disk_is_full_keeps_its_exit_status(tmp_path, state_dir):
    """The launcher writes the status through the reserve the run got when it started (before:
    ENOSPC writing the status killed the launcher, and the run read "exited with code -9")."""
    store = RunStore(state_dir, "n0", tmp_path / "envs", run_as="agent", launcher=ExecLauncher())
    r, go = waiter(tmp_path, "j1", 0)
    store.start(r)
    fill(state_dir)
    go.touch()
    run = exited(store, r.key)
    assert (run.exit_code, run.lost) == (0, False)


def test_a_job_printing_onto_a_full_disk_is_not_hurt_and_its_log_says_what_was_lost(tmp_path, state_dir):
    """The job's output goes through its launcher, which drops what the full disk refuses and
    says so once it can write again (before: the job's print raised ENOSPC and it exited 1)."""
    store = RunStore(state_dir, "n0", tmp_path / "envs", run_as="agent", launcher=ExecLauncher())
    room = tmp_path / "room"
    # More than the relay's pipe (1 MiB) and one read of it (1 MiB) hold: the print can only return
    # once the launcher has tried to write some of it onto the full disk (with 1 MiB the print could
    # end in the pipe, the disk be freed, and nothing be lost: flaky).
    r, go = waiter(tmp_path, "j2", 4 << 20, then=room)
    store.start(r)
    filler = fill(state_dir)
    go.touch()
    wait_for(lambda: Path(f"{go}.printed").exists(), WAIT_S, "the job to print onto the full disk", poll=0.02)
    filler.unlink()
    room.touch()
    run = exited(store, r.key)
    assert run.exit_code == 0
    text = store.log_path("j2", 0).read_text()
    assert "bytes of output lost here: the node's log disk was full" in text
    assert text.rstrip().splitlines()[-2:][0] == "after the disk had room again"


def test_a_run_that_cannot_start_for_a_full_disk_leaves_nothing_and_can_start_later(tmp_path, state_dir):
    store = RunStore(state_dir, "n0", tmp_path / "envs", run_as="agent", launcher=ExecLauncher())
    r = ra(tmp_path, "j3")
    filler = fill(state_dir)
    with pytest.raises(DiskFull, match=rf"state directory full: {state_dir} \(ENOSPC\)"):
        store.start(r)
    assert not (store.runs_dir / r.key).exists() and not (store.control_root / r.key).exists()
    filler.unlink()
    store.start(r)
    assert exited(store, r.key).exit_code == 0


def test_the_liveness_stamp_stays_fresh_on_a_full_disk(tmp_path, state_dir):
    """Overwritten in place (no new block), so the node's runs are not fenced for it (before:
    ENOSPC, and the agent exited)."""
    store = RunStore(state_dir, "n0", tmp_path / "envs", run_as="agent", launcher=ExecLauncher())
    store.mark_alive(1.5)
    fill(state_dir)
    store.mark_alive(12345.25)
    assert read_stamp(str(state_dir / "alive")) == 12345.25


# ------------------------------------------------------------------------------ the agent


def agent_on(tmp_path: Path, state_dir: Path, sent: list) -> Agent:
    cfg = AgentConfig(node="n0", state_dir=str(state_dir), env_root=str(tmp_path / "envs"), gpu_source="sim",
                      run_as="agent", launcher=LAUNCH_EXEC, state_min_free_bytes=256 * 1024)
    agent = Agent(Config(agent=cfg))

    async def publish(ra, kind, **fields):
        sent.append((ra.key, kind, fields))
        return True

    agent.reports.publish = publish  # type: ignore[method-assign]
    return agent


def assign(agent: Agent, *runs: RunAssignment) -> None:
    entry = SimpleNamespace(value=encode(NodeAssignment(node="n0", fence=1, runs=runs)), operation=None)
    agent.assignment.on_assignment(entry)


def heartbeat(agent: Agent) -> NodeRecord:
    """One heartbeat, its KV put and telemetry recorded; returns the record put."""
    puts: list[bytes] = []

    async def put(key, data):
        puts.append(data)

    async def publish(subject, data):
        pass

    agent.heartbeat.connect(SimpleNamespace(publish=publish), SimpleNamespace(put=put))  # type: ignore[arg-type]
    asyncio.run(agent.heartbeat.once())
    return decode(puts[-1], NodeRecord)


def test_a_full_disk_drains_the_node_with_its_reason_and_space_back_undrains_it(tmp_path, state_dir):
    sent: list = []
    agent = agent_on(tmp_path, state_dir, sent)
    assert heartbeat(agent).drain_reason == ""
    filler = fill(state_dir)
    record = heartbeat(agent)  # before: ENOSPC on the stamp, LocalStateError, the agent exited
    assert record.drain_reason == f"state directory full: {state_dir} (ENOSPC)"
    filler.unlink()
    assert heartbeat(agent).drain_reason == ""


def test_a_run_assigned_onto_a_full_disk_is_an_interruption_with_the_reason(tmp_path, state_dir):
    """Reported ended by the platform (the leader requeues it, never a user failure), not started
    again while the assignment still names it, and the node drains at once."""
    sent: list = []
    agent = agent_on(tmp_path, state_dir, sent)
    r = ra(tmp_path, "j4")
    filler = fill(state_dir)
    assign(agent, r)
    asyncio.run(agent.reconcile())
    asyncio.run(agent.reconcile())
    asyncio.run(agent.reconcile())
    assert [(k, kind) for k, kind, _ in sent] == [(r.key, RunEventKind.EXITED)]
    fields = sent[0][2]
    assert fields["platform_stopped"] is True
    assert fields["message"] == f"not started on n0: state directory full: {state_dir} (ENOSPC)"
    assert agent.heartbeat.now.is_set()
    filler.unlink()
    asyncio.run(agent.reconcile())
    assert not (agent.store.runs_dir / r.key).exists()  # still not started: it was reported ended
    assign(agent)  # the leader took it away; a new run starts here again
    r2 = ra(tmp_path, "j5")
    assign(agent, r2)
    asyncio.run(agent.reconcile())
    assert exited(agent.store, r2.key).exit_code == 0


def test_a_run_whose_end_a_full_disk_kept_from_record_is_not_the_users_failure(tmp_path, state_dir):
    """A launcher gone without a status on a node whose disk was full: the platform lost the run
    (before: "exited with code -9", a failure of the job)."""
    sent: list = []
    agent = agent_on(tmp_path, state_dir, sent)
    r, go = waiter(tmp_path, "j6", 0)
    assign(agent, r)
    asyncio.run(agent.reconcile())
    wait_for(lambda: (agent.store.dir(r.key) / "child_pid").exists(), WAIT_S, "the job to start", poll=0.02)
    child = int((agent.store.dir(r.key) / "child_pid").read_text())
    launcher = int((agent.store.dir(r.key) / "launcher_pid").read_text().split()[0])
    fill(state_dir)
    heartbeat(agent)
    os.kill(launcher, signal.SIGKILL)  # what a launcher that could not write its status leaves
    os.killpg(child, signal.SIGKILL)
    wait_for(lambda: agent.store.snapshot()[r.key].phase is RunPhase.EXITED, WAIT_S, "the run to end", poll=0.02)
    asyncio.run(agent.reconcile())
    ends = [f for k, kind, f in sent if kind is RunEventKind.EXITED]
    assert len(ends) == 1 and ends[0]["platform_stopped"] is True
    assert ends[0]["message"] == f"its end could not be recorded: state directory full: {state_dir} (ENOSPC)"
