"""The agent's per-run path, kept short for throughput (issue 11) without giving up what a crash
must not lose: which state files are fsynced, runs forgotten through the trash, and a plan's
events published together. Real store, real launchers; NATS replaced by a recorder."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from types import SimpleNamespace

from waits import until, wait_for

from hfai.agent import runs, statefile
from hfai.agent.launchers import ExecLauncher
from hfai.agent.plan import RunPhase
from hfai.agent.service import Agent
from hfai.core.config import AgentConfig, Config
from hfai.protocol import encode
from hfai.protocol.types import DesiredRun, NodeAssignment, RunAssignment, RunEventKind

WAIT_S = 60.0  # a bound on waits for `true` to run on two shared cores, not a timing


def _agent(tmp_path: Path) -> Agent:
    cfg = AgentConfig(node="n0", state_dir=str(tmp_path / "state"), env_root=str(tmp_path / "envs"),
                      gpu_source="sim", run_as="agent")
    return Agent(Config(agent=cfg))


def _ra(tmp_path: Path, job_id: str, desired: DesiredRun = DesiredRun.RUN) -> RunAssignment:
    return RunAssignment(job_id=job_id, run_id=1, name=job_id, user="u", group="default", priority=10, rank=0,
                         world_size=1, master_addr="127.0.0.1", master_port=20000, entrypoint=("true",),
                         workdir=str(tmp_path), desired=desired)


def _assign(agent: Agent, *runs: RunAssignment) -> None:
    agent.assignment.on_assignment(SimpleNamespace(value=encode(NodeAssignment(node="n0", fence=1, runs=runs)),
                                         operation=None))


def _wait_exited(agent: Agent, key: str) -> None:
    def exited() -> bool:
        run = agent.store.snapshot().get(key)
        return run is not None and run.phase is RunPhase.EXITED

    wait_for(exited, WAIT_S, f"{key} to exit", poll=0.01)


def test_the_agent_fsyncs_nothing_on_a_runs_path(tmp_path, monkeypatch):
    """Starting and reporting a run fsyncs nothing in the agent (its fence aside, on a change):
    the launch spec, the pids and the .sent markers mean nothing after a power loss, and the
    assignment and exit status reach the disk from the launcher's side (statefile.py)."""
    agent = _agent(tmp_path)
    agent.store.launcher = ExecLauncher()  # exec'd launcher: its fsyncs are its own process's, counted below
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).split(".tmp.")[0])
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)

    async def publish(ra, kind, **fields):
        return True

    agent.reports.publish = publish  # type: ignore[method-assign]
    ra = _ra(tmp_path, "j1")
    _assign(agent, ra)
    asyncio.run(agent.reconcile())  # starts it
    _wait_exited(agent, ra.key)
    asyncio.run(agent.reconcile())  # reports STARTED and EXITED
    run = agent.store.snapshot()[ra.key]
    assert run.sent == {RunEventKind.STARTED, RunEventKind.EXITED} and run.exit_code == 0
    assert synced == ["fence"]  # the newest fence it was told: durable, never goes back
    files = {p.name for p in agent.store.dir(ra.key).iterdir()}
    assert {"assignment", "launch", "launcher_pid", "child_pid", "exit_code", "started.sent", "exited.sent"} <= files
    assert not [f for f in files if ".tmp." in f]


def test_a_forgotten_run_goes_through_the_trash(tmp_path):
    """Clean-up moves the run and control directories aside at once (a snapshot no longer sees the
    run) and the trash is emptied later; the same key forgotten twice does not collide there."""
    agent = _agent(tmp_path)
    store = agent.store
    ra = _ra(tmp_path, "j2", DesiredRun.SUSPEND)
    for _ in range(2):  # never ran here: recorded, reported, forgotten; then the same again
        store.record_never_ran(ra)
        store.mark_sent(ra.key, RunEventKind.EXITED)
        store.control_root.joinpath(ra.key).mkdir()
        assert ra.key in store.snapshot()
        store.cleanup(ra.key)
        assert ra.key not in store.snapshot() and not store.control_root.joinpath(ra.key).exists()
    assert len(list(store.trash_dir.iterdir())) == 4  # two run and two control directories
    assert store.empty_trash() == 4 and not any(store.trash_dir.iterdir())


def test_the_trash_task_empties_what_reconcile_forgets(tmp_path):
    agent = _agent(tmp_path)
    ra = _ra(tmp_path, "j3")
    sent: list[RunEventKind] = []

    async def publish(ra, kind, **fields):
        sent.append(kind)
        return True

    agent.reports.publish = publish  # type: ignore[method-assign]

    async def scenario() -> None:
        trash = asyncio.create_task(agent.cleanup.trash_loop())
        try:
            _assign(agent, ra)
            await agent.reconcile()
            await asyncio.to_thread(_wait_exited, agent, ra.key)
            await agent.reconcile()  # reports
            _assign(agent)  # no longer wanted: forgotten
            await agent.reconcile()
            trash_dir = agent.store.trash_dir
            await until(lambda: not (trash_dir.exists() and any(trash_dir.iterdir())), WAIT_S,
                        "the trash to be emptied", poll=0.01)
        finally:
            trash.cancel()
            await asyncio.gather(trash, return_exceptions=True)

    asyncio.run(scenario())
    assert sent == [RunEventKind.STARTED, RunEventKind.EXITED]
    assert agent.store.trash_dir.is_dir() and not any(agent.store.runs_dir.iterdir())


def test_a_plans_events_are_in_flight_together(tmp_path):
    """A run that started and exited between two plans has STARTED and EXITED published at once
    (one round trip to JetStream, not two), in that order, each marked sent once acknowledged."""
    agent = _agent(tmp_path)
    ra = _ra(tmp_path, "j4")
    started: list[RunEventKind] = []

    async def scenario() -> None:
        in_flight = asyncio.Event()

        async def publish(ra, kind, **fields):
            started.append(kind)
            if len(started) == 2:
                in_flight.set()
            # Acknowledged only once both are out: one after the other would wait here forever.
            await asyncio.wait_for(in_flight.wait(), WAIT_S)
            return kind is RunEventKind.EXITED  # STARTED not acknowledged: sent again next time

        agent.reports.publish = publish  # type: ignore[method-assign]
        _assign(agent, ra)
        await agent.reconcile()
        await asyncio.to_thread(_wait_exited, agent, ra.key)
        await agent.reconcile()

    asyncio.run(scenario())
    assert started == [RunEventKind.STARTED, RunEventKind.EXITED]
    assert agent.store.snapshot()[ra.key].sent == {RunEventKind.EXITED}


def test_the_zygote_hands_out_a_settled_spare_and_leaves_none_behind(tmp_path):
    """The launcher answered is a child forked ahead, already leading its own session; the next
    spare waits likewise; when the agent lets go of the zygote, the waiting spare leaves too."""
    import psutil

    from hfai.agent import zygote
    from hfai.agent.launchspec import LaunchSpec

    z = zygote.Zygote()
    try:
        run_dir, log = tmp_path / "run", tmp_path / "log"
        run_dir.mkdir()
        log.touch()
        spec = LaunchSpec(argv=("sleep", "30"), env={}, cwd=str(tmp_path), log=str(log), log_cap=0)
        (run_dir / "launch").write_bytes(spec.to_json())
        pid = z.spawn(str(run_dir))
        assert z._proc is not None and os.getsid(pid) == pid
        spares = wait_for(lambda: [p for p in psutil.Process(z._proc.pid).children() if p.pid != pid], WAIT_S,
                          "a spare forked after the answer", poll=0.01)
        assert len(spares) == 1
    finally:
        z.close()
        wait_for((run_dir / "child_pid").exists, WAIT_S, "the child's pid file", poll=0.01)
        os.killpg(int((run_dir / "child_pid").read_text()), signal.SIGKILL)
    gone, alive = psutil.wait_procs(spares, timeout=WAIT_S)
    assert not alive


def test_the_launcher_fsyncs_the_status_and_assignment_after_it_exits(tmp_path, monkeypatch):
    """The fsyncs happen in a child of the launcher, so its exit (which wakes the agent) does not
    wait for the disk; they do happen."""
    from hfai.agent import launcher

    record = tmp_path / "synced"
    files = [str(tmp_path / "exit_code"), str(tmp_path / "assignment")]
    for f in files:
        Path(f).write_text("0\n")

    def fsync(fd: int) -> None:  # runs in the forked child: tell the test through a file
        with open(record, "a") as out:
            out.write(os.readlink(f"/proc/self/fd/{fd}") + "\n")

    monkeypatch.setattr(os, "fsync", fsync)
    launcher._persist_after_exit(files)
    wait_for(lambda: record.exists() and len(record.read_text().splitlines()) == 2, WAIT_S,
             "the launcher's child to fsync", poll=0.01)
    assert record.read_text().splitlines() == files


def test_a_run_a_crash_left_unreadable_is_reported_ended_not_started_again(tmp_path):
    """A crash of the host before the launcher fsynced the assignment can leave it empty: the
    snapshot skips the directory, the plan asks for a start, and the store records the run as
    killed instead (it did run: its directory is the record) for the next plan to report."""
    agent = _agent(tmp_path)
    sent: list[tuple[RunEventKind, dict]] = []

    async def publish(ra, kind, **fields):
        sent.append((kind, fields))
        return True

    agent.reports.publish = publish  # type: ignore[method-assign]
    ra = _ra(tmp_path, "j5")
    d = agent.store.runs_dir / ra.key
    d.mkdir()
    (d / "assignment").write_bytes(b"")  # what a crash can leave of a file not yet on disk
    assert ra.key not in agent.store.snapshot()
    _assign(agent, ra)
    asyncio.run(agent.reconcile())  # the plan says start; the store says it is over
    assert not (d / "launcher_pid").exists() and agent.reconciler.wake.is_set()
    asyncio.run(agent.reconcile())
    assert [(k, f.get("exit_code")) for k, f in sent] == [(RunEventKind.STARTED, None), (RunEventKind.EXITED, -9)]


def test_a_forgotten_runs_files_serve_the_next_run(tmp_path, monkeypatch):
    """A run's reserves (statefile.py), unused, are as good for the next run, and its other files
    as the next run's temp files: emptying the trash keeps a forgotten run's directory with its
    reserves and its files renamed to blanks, and the next start renames it into place; its
    writes, and its launcher's, take the blanks, rather than making new files (on a filesystem that
    looks long for a free inode, the costly part of a run's start: docs/performance.md). Nothing of
    the first run reaches the next."""
    agent = _agent(tmp_path)
    store = agent.store
    first, second = _ra(tmp_path, "j4"), _ra(tmp_path, "j5")
    store.start(first)
    _wait_exited(agent, first.key)
    store.mark_sent(first.key, RunEventKind.STARTED)
    store.mark_sent(first.key, RunEventKind.EXITED)
    store.cleanup(first.key)
    store.empty_trash()
    reserves = {f"{name}.reserve" for name in runs.RESERVED}
    (spare,) = store.spare_dir.iterdir()
    # The exit status, pids, assignment, launch spec and markers (and usage, with a cgroup): blanks.
    blanks = {"blank.a0", "blank.a1", "blank.a2", "blank.a3", "blank.a4", "blank.l0", "blank.l1"}
    assert blanks | reserves <= {p.name for p in spare.iterdir()} <= reserves | set(statefile.blank_names())
    made: list[str] = []
    real = runs.make_reserve
    monkeypatch.setattr(runs, "make_reserve", lambda path: made.append(os.fspath(path)) or real(path))
    store.start(second)
    assert made == [] and not spare.exists()
    _wait_exited(agent, second.key)
    run = store.snapshot()[second.key]
    assert run.assignment == second and run.exit_code == 0 and not run.sent
    store.mark_sent(second.key, RunEventKind.STARTED)
    store.mark_sent(second.key, RunEventKind.EXITED)
    assert store.snapshot()[second.key].sent == {RunEventKind.STARTED, RunEventKind.EXITED}
    left = {p.name for p in store.dir(second.key).iterdir()}
    assert reserves <= left and not left & blanks  # every file the second run wrote was a blank


def test_only_a_whole_run_directory_of_the_agent_is_kept_as_a_spare(tmp_path):
    """What a job could have written (its control directory), or a run directory with a reserve
    used, missing or not a plain file of its own, or holding a folder, is deleted, never kept."""
    store = _agent(tmp_path).store
    store.trash_dir.mkdir()

    def trashed(name: str, skip: str = "") -> Path:
        d = store.trash_dir / name
        d.mkdir(mode=0o700)
        for reserve in runs.RESERVED:
            if reserve != skip:
                runs.make_reserve(d / reserve)
        return d

    trashed("j6.1.control.7.1")  # a control directory, reserves planted
    trashed("j7.1.7.2", skip="exit_code")  # used on a full disk, or missing
    trashed("j8.1.7.3").joinpath("sub").mkdir()
    linked = trashed("j9.1.7.4")
    os.link(linked / "term.reserve", tmp_path / "elsewhere")  # a second name: not the run's alone
    symlinked = trashed("j10.1.7.5")
    (symlinked / "hung.reserve").unlink()
    (symlinked / "hung.reserve").symlink_to(tmp_path / "elsewhere")
    trashed("j11.1.7.6").chmod(0o755)
    whole = trashed("j12.1.7.7")
    (whole / "exit_code").write_text("0\n")
    assert store.empty_trash() == 7 and not any(store.trash_dir.iterdir())
    assert [p.name for p in store.spare_dir.iterdir()] == ["j12.1.7.7"]


def test_once_the_jobs_output_ended_the_launcher_waits_for_the_exit_alone(tmp_path, monkeypatch):
    """In a container the job's last writer (bwrap's init) closes the output pipe some
    milliseconds before bwrap exits (its PID namespace's teardown). A pipe at its end stays
    readable: the launcher then waits on the exit alone, instead of spinning on the pipe."""
    from hfai.agent import launcher
    from hfai.agent.output import Output

    out = Output(os.open(tmp_path / "job.log", os.O_RDWR | os.O_CREAT, 0o600), 0)
    out.job_started()  # the launcher's copy of the write end goes; no job holds one: the pipe ended
    assert not out.pump() and out.ended
    waited_on: list[list[int]] = []

    def select(rlist, wlist, xlist, timeout):
        waited_on.append(list(rlist))
        return [], [], []

    monkeypatch.setattr(launcher.select, "select", select)
    exit_r, exit_w = os.pipe()  # the child's pidfd: not readable, the child lives
    try:
        assert launcher._wait(SimpleNamespace(poll=lambda: None), exit_r, 0.01, out) is None
    finally:
        os.close(exit_r)
        os.close(exit_w)
        out.close()
    assert waited_on == [[exit_r]]


def test_a_blank_written_over_keeps_nothing_of_its_old_bytes(tmp_path):
    """A write through a blank longer than the new content reads as the new content alone."""
    (tmp_path / "blank.a0").write_bytes(b"x" * 10000)
    statefile.write_volatile(tmp_path / "exit_code", b"0\n", runs.AGENT_POOL)
    assert (tmp_path / "exit_code").read_bytes() == b"0\n" and not (tmp_path / "blank.a0").exists()
    statefile.touch(tmp_path / "started.sent")  # no blank left: a new, empty marker
    assert (tmp_path / "started.sent").read_bytes() == b""
