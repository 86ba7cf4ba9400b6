"""A run's lifecycle on the node (agent/lifecycle.py): one state per set of run-directory files,
the same for an agent restarted over them; the agent's acts take only the steps the table allows,
and its executor refuses any other before it touches a file."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
from dataclasses import replace
from pathlib import Path

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hfai._job import ACK_FILE
from hfai._proc import start_ticks
from hfai.agent.launchers import LAUNCH_EXEC, ExecLauncher
from hfai.agent.lifecycle import RunState
from hfai.agent.plan import STEPS, Act, Action, LocalRun, RunPhase, next_state, plan
from hfai.agent.runs import KILLED_FILE, RunStore
from hfai.agent.stamps import SUSPEND_STAMP
from hfai.protocol import encode
from hfai.protocol.errors import IllegalTransition
from hfai.protocol.types import DesiredRun, RunAssignment, RunEventKind

S = RunState
RA = RunAssignment(job_id="j", run_id=1, name="n", user="u", group="default", priority=10, rank=0, world_size=1,
                   master_addr="a", master_port=1, entrypoint=("true",), workdir="/", desired=DesiredRun.RUN,
                   ack_window_s=10.0, kill_window_s=3.0)
STAMP = "1700000000.0 50.0\n"  # wall, boot clock (stamps.py)

# The files a run's state is read from; "launcher" is a live launcher's pid file.
FILES = ("exit_code", "launcher", "term", KILLED_FILE, SUSPEND_STAMP, "ack",
         "started.sent", "suspend_acked.sent", "exited.sent")


def _store(root: Path) -> RunStore:
    return RunStore(root / "state", "n0", root / "envs", run_as="agent", launcher=ExecLauncher())


def _pid_line(pid: int) -> str:
    return f"{pid} {psutil.Process(pid).create_time()} {start_ticks(pid)}"


def _write(store: RunStore, files: set[str], launcher_pid: int) -> None:
    """A run directory holding ``files`` (FILES' names), as the agent, its launcher and the job
    write them."""
    d = store.dir(RA.key)
    d.mkdir()
    store.control_dir(RA.key).mkdir()
    (d / "assignment").write_bytes(encode(RA))
    contents = {"exit_code": "0\n", "launcher": _pid_line(launcher_pid), "term": STAMP, SUSPEND_STAMP: STAMP}
    for name in files:
        if name == "ack":
            (store.control_dir(RA.key) / ACK_FILE).write_text(f"{launcher_pid} 1700000000.0 exit\n")
        else:
            (d / ("launcher_pid" if name == "launcher" else name)).write_text(contents.get(name, ""))


def _expected(f: set[str]) -> list[RunState]:
    """The states whose definition (docs/architecture.md's table) ``f`` meets: exactly one."""
    over = "exit_code" in f or "launcher" not in f
    live = not over
    flagged, termed, killed = SUSPEND_STAMP in f, "term" in f, KILLED_FILE in f
    quiet = live and not (flagged or termed or killed)
    meets = {
        S.STARTING: quiet and "started.sent" not in f,
        S.RUNNING: quiet and "started.sent" in f,
        S.SUSPEND_RAISED: live and flagged and "ack" not in f and not termed and not killed,
        S.ACKNOWLEDGED: live and flagged and "ack" in f and not termed and not killed,
        S.TERMINATED: live and termed and not killed,
        S.KILLED: live and killed,
        S.EXITED: over and "exited.sent" not in f,
        S.REPORTED: over and "exited.sent" in f,
    }
    return [s for s, yes in meets.items() if yes]


def test_every_set_of_files_is_exactly_one_state_and_a_restarted_agent_reads_the_same(tmp_path: Path):
    """Every one of the 2**9 sets of FILES (all of them, not a sample), written as a run directory:
    it meets exactly one state's definition, the snapshot reads that state, and so does a new
    RunStore over the same directory (an agent restarted mid-run). Every state but ABSENT (no
    directory) is some set's."""
    seen = set()
    for i, bits in enumerate(itertools.product((False, True), repeat=len(FILES))):
        files = {name for name, on in zip(FILES, bits, strict=True) if on}
        root = tmp_path / str(i)
        store = _store(root)
        _write(store, files, os.getpid())  # this test's process stands in for a live launcher
        state = store.snapshot()[RA.key].state
        assert _expected(files) == [state], sorted(files)
        assert _store(root).snapshot()[RA.key].state is state, sorted(files)
        seen.add(state)
    assert seen == set(RunState) - {S.ABSENT}


def test_the_agents_writes_take_the_runs_files_along_the_steps_the_table_gives(tmp_path: Path):
    """Each write helper the executor calls, on a real run directory, leaves the files in the
    state :func:`next_state` says its act leads to (and a restarted agent reads the same)."""
    store = _store(tmp_path)
    launcher = subprocess.Popen(["sleep", "600"], start_new_session=True)
    job = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        _write(store, {"launcher"}, launcher.pid)
        (store.dir(RA.key) / "child_pid").write_text(f"{job.pid}\n")
        states = [store.snapshot()[RA.key].state]

        def step(act: Act | None, write) -> None:
            before = store.snapshot()[RA.key]
            write()
            after = store.snapshot().get(RA.key)
            state = S.ABSENT if after is None else after.state
            if act is None:  # a step of the job's own
                before.state.check(state)
            else:
                assert next_state(before, act) is state, act
            again = _store(tmp_path).snapshot().get(RA.key)
            assert (S.ABSENT if again is None else again.state) is state
            states.append(state)

        step(Act.REPORT_STARTED, lambda: store.mark_sent(RA.key, RunEventKind.STARTED))
        step(Act.RAISE_SUSPEND, lambda: store.raise_suspend(RA.key))
        step(None, lambda: (store.control_dir(RA.key) / ACK_FILE).write_text("1 2 exit\n"))
        step(Act.REPORT_ACK, lambda: store.mark_sent(RA.key, RunEventKind.SUSPEND_ACKED))
        step(Act.TERMINATE, lambda: store.signal(RA.key, signal.SIGTERM))
        step(Act.KILL, lambda: store.signal(RA.key, signal.SIGKILL))
        step(Act.KILL, lambda: store.signal(RA.key, signal.SIGKILL))
        step(None, lambda: (launcher.kill(), launcher.wait()))  # gone without a status: killed
        step(Act.REPORT_EXIT, lambda: store.mark_sent(RA.key, RunEventKind.EXITED))
        step(Act.CLEANUP, lambda: store.cleanup(RA.key))
    finally:
        for p in (launcher, job):
            p.kill()
            p.wait()
    assert states == [S.STARTING, S.RUNNING, S.SUSPEND_RAISED, S.ACKNOWLEDGED, S.ACKNOWLEDGED, S.TERMINATED,
                      S.KILLED, S.KILLED, S.EXITED, S.REPORTED, S.ABSENT]


def test_a_run_recorded_as_never_run_and_reported_is_where_the_table_says(tmp_path: Path):
    store = _store(tmp_path)
    store.record_never_ran(RA)
    assert store.snapshot()[RA.key].state is S.EXITED
    store.mark_sent(RA.key, RunEventKind.STARTED)
    store.mark_sent(RA.key, RunEventKind.EXITED)
    assert store.snapshot()[RA.key].state is next_state(None, Act.REPORT_NEVER_RAN) is S.REPORTED


# What moves a run that is not the agent's act: the job acknowledges, the job (or the kernel) ends it.
OUTSIDE_STEPS = {(S.SUSPEND_RAISED, S.ACKNOWLEDGED)} | {(s, S.EXITED) for s in RunState if s.alive}


def test_every_step_of_every_act_is_in_the_table_and_every_edge_is_taken():
    taken = set()
    for table in STEPS.values():
        for source, path in table.items():
            at = source
            for new in path:
                taken.add((at, at.check(new)))  # check raises if the act's step is not in the table
                at = new
    edges = {(s, t) for s in RunState for t in RunState if _legal(s, t)}
    assert edges == taken | OUTSIDE_STEPS  # no edge that nothing takes
    assert set(STEPS) == set(Act)


def _legal(s: RunState, t: RunState) -> bool:
    try:
        s.check(t)
    except IllegalTransition:
        return False
    return True


def _run(**kw) -> LocalRun:
    return LocalRun(**{"key": RA.key, "assignment": RA, "phase": RunPhase.ALIVE,
                       "sent": frozenset({RunEventKind.STARTED}), **kw})


@pytest.mark.parametrize(("run", "act"), [
    (_run(), Act.KILL),  # SIGKILL before a SIGTERM
    (_run(suspend_ts=1.0), Act.RAISE_SUSPEND),  # a second flag would restart the ack window
    (_run(term_ts=1.0), Act.TERMINATE),
    (_run(), Act.REPORT_EXIT),  # alive
    (_run(), Act.CLEANUP),
    (_run(phase=RunPhase.EXITED, exit_code=0), Act.CLEANUP),  # its exit not reported yet
    (_run(), Act.START),  # started twice
    (None, Act.REPORT_EXIT),
    (None, Act.KILL),
])
def test_an_act_the_runs_state_does_not_allow_is_refused(run, act):
    with pytest.raises(IllegalTransition):
        next_state(run, act)


def test_an_illegal_step_is_refused():
    with pytest.raises(IllegalTransition, match="from running to killed"):
        S.RUNNING.check(S.KILLED)
    for s, t in ((S.REPORTED, S.RUNNING), (S.EXITED, S.TERMINATED), (S.ACKNOWLEDGED, S.SUSPEND_RAISED),
                 (S.ABSENT, S.REPORTED), (S.KILLED, S.TERMINATED)):
        assert not _legal(s, t)


def test_the_agent_refuses_an_illegal_act_before_it_touches_the_run(tmp_path: Path):
    """The executor checks each act against the snapshot the plan was made from: a SIGKILL for a
    run never sent SIGTERM, or an exit report for a live run, raises and writes nothing."""
    from hfai.agent.service import Agent
    from hfai.core.config import AgentConfig, Config

    cfg = AgentConfig(node="n1", state_dir=str(tmp_path / "state"), env_root=str(tmp_path / "envs"),
                      gpu_source="sim", run_as="agent", launcher=LAUNCH_EXEC)
    agent = Agent(Config(agent=cfg))
    d = agent.store.dir(RA.key)
    d.mkdir()
    local = {RA.key: _run()}
    with pytest.raises(IllegalTransition):
        asyncio.run(agent.reconciler.do(Action(Act.KILL, RA.key, RA), local))
    with pytest.raises(IllegalTransition):
        asyncio.run(agent.reports.send([Action(Act.REPORT_EXIT, RA.key, RA)], local))
    assert list(d.iterdir()) == []


# ------------------------------------------------------------------------- the plan, at random

_ts = st.one_of(st.none(), st.floats(0, 120))


@st.composite
def _local_runs(draw) -> LocalRun:
    ra = replace(RA, job_id=draw(st.sampled_from("abc")))
    return LocalRun(key=ra.key, assignment=ra, phase=draw(st.sampled_from(RunPhase)),
                    exit_code=draw(st.one_of(st.none(), st.integers(-9, 2))), suspend_ts=draw(_ts),
                    acked=draw(st.booleans()), ack_ts=draw(_ts), term_ts=draw(_ts), killed=draw(st.booleans()),
                    sent=frozenset(draw(st.sets(st.sampled_from(RunEventKind)))), ack_stop=draw(st.booleans()))


@st.composite
def _desired(draw) -> RunAssignment:
    return replace(RA, job_id=draw(st.sampled_from("abc")), desired=draw(st.sampled_from(DesiredRun)),
                   ack_window_s=draw(st.floats(0, 30)), kill_window_s=draw(st.floats(0, 30)))


@settings(max_examples=400, deadline=None)
@given(st.lists(_desired(), max_size=3), st.lists(_local_runs(), max_size=3), st.floats(0, 150),
       st.sampled_from([0.0, 2.0, 15.0]))
def test_the_plan_only_takes_steps_the_lifecycle_allows(desired, local, now, grace):
    """Whatever the node holds and the leader wants, each act of the plan is legal from its run's
    state, and a run gets at most one act that changes its files besides its reports."""
    wanted = {ra.key: ra for ra in desired}
    runs = {r.key: r for r in local}
    actions = plan(wanted, runs, now, grace)
    for a in actions:
        next_state(runs.get(a.key), a.act)
    for key in {a.key for a in actions}:
        acts = [a.act for a in actions if a.key == key and not a.act.value.startswith("report")]
        assert len(acts) <= 1, acts
