"""The agent's loops on a FakeClock: the interrupt windows, the heartbeat period and the backoff
after NATS refused a round are timed by the clock the agent is given, so these tests move time
instead of sleeping through it (issue 22, item 6). Real processes where a job is involved; no
NATS (the publish is a recorder)."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from waits import until

from hfai._job import SUSPEND_FILE
from hfai.agent import stamps
from hfai.agent.launchers import ExecLauncher
from hfai.agent.plan import RunPhase
from hfai.agent.service import Agent
from hfai.core.clock import FakeClock
from hfai.core.config import AgentConfig, Config
from hfai.core.daemon import wait_event
from hfai.protocol import encode
from hfai.protocol.types import DesiredRun, NodeAssignment, RunAssignment, RunEventKind

#: A bound on real waits for a process (start, death) on two shared cores, not a timing.
WAIT_S = 30.0
ACK_WINDOW_S = 60.0
KILL_WINDOW_S = 30.0
TICK_S = 0.5

# Never acknowledges the suspend and ignores SIGTERM: only the two windows end it.
STUBBORN = ("import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "pathlib.Path(sys.argv[1]).write_text('up'); time.sleep(600)")


def _clock_at_now() -> FakeClock:
    """A fake clock reading the real time when made (the wall times it stamps look real)."""
    mono = time.monotonic()
    return FakeClock(start=mono, wall_offset=time.time() - mono)


def _agent(tmp_path: Path, clock: FakeClock, **agent: object) -> tuple[Agent, list[tuple[RunEventKind, dict]]]:
    cfg = AgentConfig(node="n0", state_dir=str(tmp_path / "state"), env_root=str(tmp_path / "envs"),
                      gpu_source="sim", run_as="agent", launcher="exec", reconcile_interval_s=TICK_S, **agent)
    a = Agent(Config(agent=cfg), clock=clock)
    sent: list[tuple[RunEventKind, dict]] = []

    async def publish(ra, kind, **fields):
        sent.append((kind, fields))
        return True

    a.reports.publish = publish  # type: ignore[method-assign]
    return a, sent


def _assign(agent: Agent, ra: RunAssignment, fence: int) -> None:
    entry = SimpleNamespace(value=encode(NodeAssignment(node="n0", fence=fence, runs=(ra,))), operation=None)
    agent.assignment.on_assignment(entry)


def _ra(tmp_path: Path, desired: DesiredRun) -> RunAssignment:
    return RunAssignment(job_id="stubborn", run_id=1, name="stubborn", user="u", group="default", priority=10,
                         rank=0, world_size=1, master_addr="127.0.0.1", master_port=20000,
                         entrypoint=(sys.executable, "-c", STUBBORN, str(tmp_path / "up")), workdir=str(tmp_path),
                         desired=desired, ack_window_s=ACK_WINDOW_S, kill_window_s=KILL_WINDOW_S)


async def _real_wait(done, what: str) -> None:
    """Wait for a process to do something, in real time (the fake clock stands still)."""
    await until(done, WAIT_S, what, poll=0.02)


async def _advance_to(clock: FakeClock, boot: float) -> None:
    """Move the fake clock to ``boot`` on its boot clock, which the windows run on."""
    await clock.advance(max(0.0, boot - clock.boottime()))


def _boot_stamp(path: Path) -> float:
    boot = stamps.parse(path.read_text())[1]
    assert boot is not None, f"{path} holds no boot-clock stamp"
    return boot


async def test_the_ack_and_kill_windows_run_on_the_agents_clock(tmp_path):
    """A job that neither acks nor heeds SIGTERM: SIGTERM comes ack_window_s after the suspend
    flag and not a tick before, SIGKILL kill_window_s after the SIGTERM; a minute and a half of
    windows pass in well under a second of real waiting."""
    clock = _clock_at_now()
    agent, sent = _agent(tmp_path, clock)
    key = "stubborn.1"
    _assign(agent, _ra(tmp_path, DesiredRun.RUN), fence=1)
    loop = asyncio.create_task(agent.reconciler.loop())
    try:
        await _real_wait((tmp_path / "up").exists, "the job to start")
        _assign(agent, _ra(tmp_path, DesiredRun.SUSPEND), fence=2)
        flag = agent.store.control_dir(key) / SUSPEND_FILE
        await _real_wait(flag.exists, "the suspend flag")
        term_at = _boot_stamp(agent.store.dir(key) / stamps.SUSPEND_STAMP) + ACK_WINDOW_S
        term_file = agent.store.dir(key) / "term"

        await _advance_to(clock, term_at - TICK_S)
        assert not term_file.exists(), "SIGTERM before the ack window was over"
        await clock.advance(2 * TICK_S)
        assert term_file.exists(), "no SIGTERM once the ack window was over"
        termed = _boot_stamp(term_file)
        assert term_at <= termed <= term_at + 2 * TICK_S  # stamped on the agent's clock

        await _advance_to(clock, termed + KILL_WINDOW_S - TICK_S)
        assert agent.store.snapshot()[key].phase is RunPhase.ALIVE, "killed before the kill window was over"
        await clock.advance(2 * TICK_S)
        # The launcher's exit wakes the loop itself (pidfd): no more fake time is needed.
        await _real_wait(lambda: any(k is RunEventKind.EXITED for k, _ in sent), "the exit report")
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
        for k in agent.store.snapshot():
            agent.store.signal(k, signal.SIGKILL)
    exited = next(fields for kind, fields in sent if kind is RunEventKind.EXITED)
    assert exited["exit_code"] == -signal.SIGKILL and exited["platform_stopped"] and not exited["acked"]


async def test_a_round_nats_refused_is_retried_after_a_growing_jittered_backoff(tmp_path):
    """Not the fixed period: a thousand agents meet the same NATS restart together. Back to the
    period after a round went through."""
    clock = FakeClock()
    agent, _ = _agent(tmp_path, clock, heartbeat_interval_s=4.0)
    agent.store.launcher = ExecLauncher()
    rounds: list[float] = []

    async def reconcile() -> None:
        rounds.append(clock.monotonic())
        agent.reports.unacked = len(rounds) <= 5  # the first five rounds' reports go unacknowledged

    agent.reconciler.reconcile = reconcile  # type: ignore[method-assign]
    loop = asyncio.create_task(agent.reconciler.loop())
    try:
        await clock.advance(60.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    gaps = [b - a for a, b in zip(rounds, rounds[1:], strict=False)]
    ceilings = [min(4.0, TICK_S * 2 ** i) for i in range(5)]  # capped at a heartbeat interval
    for gap, ceiling in zip(gaps[:5], ceilings, strict=True):
        assert ceiling / 2 <= gap <= ceiling, (gaps[:5], ceilings)
    assert gaps[5:] and all(gap == pytest.approx(TICK_S) for gap in gaps[5:])


async def test_heartbeats_come_each_interval_and_at_once_when_asked(tmp_path):
    clock = FakeClock()
    agent, _ = _agent(tmp_path, clock, heartbeat_interval_s=5.0)
    beats: list[float] = []

    async def beat() -> None:
        beats.append(clock.monotonic())

    agent.heartbeat.once = beat  # type: ignore[method-assign]
    start = clock.monotonic()
    loop = asyncio.create_task(agent.heartbeat.loop())
    try:
        await clock.advance(12.0)
        agent.heartbeat.now.set()  # the node's drain reason changed
        await clock.settle()
        await clock.advance(5.0)
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert [b - start for b in beats] == [5.0, 10.0, 12.0, 17.0]


async def test_a_cancelled_wait_ends_with_nothing_left_running():
    clock = FakeClock()
    event = asyncio.Event()
    waiter = asyncio.create_task(wait_event(event, 10.0, clock))
    await clock.settle()
    assert clock.sleepers == 1
    event.set()
    waiter.cancel()  # just as the event is set: the cancellation still wins
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert asyncio.all_tasks() == {asyncio.current_task()}
    assert await wait_event(event, 10.0, clock) is True
    event.clear()
    timed_out = asyncio.create_task(wait_event(event, 10.0, clock))
    await clock.advance(10.0)
    assert timed_out.done() and timed_out.result() is False
