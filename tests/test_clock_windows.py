"""Issue 38 §3: the agent's interrupt windows run on its boot clock, from stamps of its own, so a
wall clock stepped back or forward neither stretches nor cuts them, and nothing a job writes (its
ack file's time, a suspend flag it deletes) moves them. The agent runs on a FakeClock whose wall
clock the test steps (``wall_offset``) while its boot clock stands still; the job is a real process
and the signals are real. A faketime run of the same with the system clock is
test_clock_faketime_live.py."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from waits import until

from hfai._job import ACK_FILE, SUSPEND_FILE
from hfai.agent import stamps
from hfai.agent.plan import RunPhase
from hfai.agent.service import Agent
from hfai.core.clock import FakeClock
from hfai.core.config import AgentConfig, Config
from hfai.protocol import encode
from hfai.protocol.types import DesiredRun, NodeAssignment, RunAssignment, RunEventKind

#: A bound on real waits for a process (start, death) on two shared cores, not a timing.
WAIT_S = 30.0
ACK_WINDOW_S = 10.0
KILL_WINDOW_S = 30.0
GRACE_S = 8.0
TICK_S = 0.5
KEY = "stubborn.1"

# Never exits by itself and ignores SIGTERM: only the agent's windows end it.
STUBBORN = ("import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "pathlib.Path(sys.argv[1]).write_text('up'); time.sleep(600)")


def _clock_at_now() -> FakeClock:
    """Fake time that reads the real time when made (the filesystem's times look current)."""
    mono = time.monotonic()
    return FakeClock(start=mono, wall_offset=time.time() - mono)


def _agent(tmp_path: Path, clock: FakeClock) -> tuple[Agent, list[RunEventKind]]:
    cfg = AgentConfig(node="n0", state_dir=str(tmp_path / "state"), env_root=str(tmp_path / "envs"),
                      gpu_source="sim", run_as="agent", launcher="exec", reconcile_interval_s=TICK_S,
                      ack_exit_grace_s=GRACE_S)
    agent = Agent(Config(agent=cfg), clock=clock)
    sent: list[RunEventKind] = []

    async def publish(ra, kind, **fields):
        sent.append(kind)
        return True

    agent.reports.publish = publish  # type: ignore[method-assign]
    return agent, sent


def _assign(agent: Agent, tmp_path: Path, desired: DesiredRun, fence: int) -> None:
    ra = RunAssignment(job_id="stubborn", run_id=1, name="stubborn", user="u", group="default", priority=10,
                       rank=0, world_size=1, master_addr="127.0.0.1", master_port=20000,
                       entrypoint=(sys.executable, "-c", STUBBORN, str(tmp_path / "up")), workdir=str(tmp_path),
                       desired=desired, ack_window_s=ACK_WINDOW_S, kill_window_s=KILL_WINDOW_S)
    entry = SimpleNamespace(value=encode(NodeAssignment(node="n0", fence=fence, runs=(ra,))), operation=None)
    agent.assignment.on_assignment(entry)


async def _real_wait(done, what: str) -> None:
    """Wait for a process to do something, in real time (the fake clock stands still)."""
    await until(done, WAIT_S, what, poll=0.02)


class _Running:
    """The agent's reconcile loop with the stubborn job started and then asked to suspend."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.clock = _clock_at_now()
        self.agent, self.sent = _agent(tmp_path, self.clock)
        self.loop: asyncio.Task | None = None

    async def __aenter__(self) -> _Running:
        _assign(self.agent, self.tmp_path, DesiredRun.RUN, fence=1)
        self.loop = asyncio.create_task(self.agent.reconciler.loop())
        await _real_wait((self.tmp_path / "up").exists, "the job to start")
        _assign(self.agent, self.tmp_path, DesiredRun.SUSPEND, fence=2)
        await _real_wait(self.flag.exists, "the suspend flag")
        self.raised = self.clock.boottime()  # fake time stood still since the flag was raised
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.loop is not None
        self.loop.cancel()
        await asyncio.gather(self.loop, return_exceptions=True)
        for k in self.agent.store.snapshot():
            self.agent.store.signal(k, signal.SIGKILL)

    @property
    def run_dir(self) -> Path:
        return self.agent.store.dir(KEY)

    @property
    def flag(self) -> Path:
        return self.agent.store.control_dir(KEY) / SUSPEND_FILE

    @property
    def termed(self) -> bool:
        return (self.run_dir / "term").exists()

    def boot_stamp(self, name: str) -> float:
        boot = stamps.parse((self.run_dir / name).read_text())[1]
        assert boot is not None, f"{name} holds no boot-clock stamp"
        return boot

    async def advance_to(self, boot: float) -> None:
        await self.clock.advance(max(0.0, boot - self.clock.boottime()))

    async def ack(self, mtime: float | None = None) -> float:
        """The job's acknowledgement (as hfai.go_suspend writes it), dated ``mtime`` if given;
        returns the boot time the agent reported it at (and first saw it)."""
        ack = self.agent.store.control_dir(KEY) / ACK_FILE
        ack.write_text(f"{os.getpid()} {time.time()} exit\n")
        if mtime is not None:
            os.utime(ack, (mtime, mtime))

        async def reported() -> bool:
            await self.clock.advance(TICK_S)
            return RunEventKind.SUSPEND_ACKED in self.sent

        await until(reported, WAIT_S, "the acknowledgement's report", poll=0.01)
        return self.clock.boottime()


async def test_a_wall_clock_stepped_back_does_not_hold_off_the_sigterm(tmp_path):
    """The job never acknowledges: SIGTERM ack_window_s after the flag, although the wall clock
    went back 300 s in the meantime (on the wall clock the window would last 310 s)."""
    async with _Running(tmp_path) as r:
        r.clock.wall_offset -= 300.0
        await r.advance_to(r.raised + ACK_WINDOW_S - TICK_S)
        assert not r.termed, "SIGTERM before the ack window was over"
        await r.clock.advance(2 * TICK_S)
        assert r.termed, "no SIGTERM once the ack window was over on the boot clock"


async def test_a_wall_clock_stepped_forward_does_not_cut_a_checkpoint_short(tmp_path):
    """The job acknowledged and is checkpointing (the exit grace): a wall clock stepped 120 s
    forward 1 s into the grace does not bring the SIGTERM; the grace's end on the boot clock does.
    The SIGKILL then waits kill_window_s on the boot clock however the wall clock jumps."""
    async with _Running(tmp_path) as r:
        seen = await r.ack()
        await r.advance_to(seen + 1.0)
        r.clock.wall_offset += 120.0
        await r.clock.advance(TICK_S)
        assert not r.termed, "SIGTERM 1.5 s into an 8 s checkpoint: the wall clock's step cut it short"
        await r.advance_to(seen + GRACE_S + TICK_S)
        assert r.termed, "no SIGTERM once the exit grace was over"
        termed = r.clock.boottime()  # at most this, at least a tick before
        r.clock.wall_offset += 3600.0
        await r.advance_to(termed + KILL_WINDOW_S - 2 * TICK_S)
        assert r.agent.store.snapshot()[KEY].phase is RunPhase.ALIVE, "SIGKILL before the kill window was over"


async def test_an_ack_file_dated_in_the_future_does_not_extend_the_grace(tmp_path):
    """The job writes its ack file and can date it as it likes: an hour ahead must not keep it
    from its SIGTERM for an hour. The grace runs from when the agent first saw the ack."""
    async with _Running(tmp_path) as r:
        seen = await r.ack(mtime=time.time() + 3600.0)
        await r.advance_to(seen + GRACE_S + TICK_S)
        assert r.termed, "the ack file's time held off the SIGTERM"


async def test_a_suspend_flag_the_job_deletes_does_not_restart_the_window(tmp_path):
    """The job deletes its suspend flag each time it appears: the window still ends
    ack_window_s after the agent first raised it."""
    async with _Running(tmp_path) as r:
        while r.clock.boottime() < r.raised + ACK_WINDOW_S + TICK_S and not r.termed:
            r.flag.unlink(missing_ok=True)
            await r.clock.advance(TICK_S)
        assert r.termed, "deleting the suspend flag held off the SIGTERM"


async def test_the_agent_keeps_its_stamps_in_the_run_directory(tmp_path):
    """Each window's start is a stamp of the agent's own, wall and boot clock, in runs/<key>/."""
    async with _Running(tmp_path) as r:
        assert r.boot_stamp(stamps.SUSPEND_STAMP) == r.raised
        seen = await r.ack()
        assert r.boot_stamp(stamps.ACK_STAMP) <= seen
        await r.advance_to(seen + GRACE_S + TICK_S)
        assert r.termed and seen + GRACE_S <= r.boot_stamp("term") <= r.clock.boottime()
        wall = stamps.parse((r.run_dir / "term").read_text())[0]
        assert wall is not None and abs(wall - r.clock.time()) <= TICK_S


async def test_a_stepped_wall_clock_does_not_make_a_live_launcher_look_gone(tmp_path):
    """psutil's creation time of a process is the boot time plus its start in ticks, and Linux
    reports the boot time as the wall clock less the time since boot: a clock stepped back 300 s
    reads every launcher's creation time 300 s earlier than the agent recorded it, which it took
    for a recycled pid: the run read as killed (-9) while it ran on. Simulated by recording it
    300 s later, as a step back would make it: the start in ticks since boot still matches."""
    async with _Running(tmp_path) as r:
        pidfile = r.run_dir / "launcher_pid"
        fields = pidfile.read_text().split()
        fields[1] = repr(float(fields[1]) + 300.0)
        pidfile.write_text(" ".join(fields))
        run = r.agent.store.snapshot()[KEY]
        assert run.phase is RunPhase.ALIVE and not run.lost, "a clock step made the live run look gone"
