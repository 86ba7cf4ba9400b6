"""The controller's watchdog over its leader loop (issue 11): a loop that stops making progress,
or whose tasks will not stop, ends the replica with a non-zero status (systemd restarts it)
instead of leaving it on the lease doing nothing. The watchdog runs on a FakeClock: its bound passes
when the test moves time, not while it sleeps."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

from hfai.controller import service
from hfai.controller.service import Controller
from hfai.core.clock import FakeClock
from hfai.core.config import Config, ControllerConfig
from hfai.core.daemon import StuckTasksError, cancel_and_wait


def _controller(clock: FakeClock | None = None, **cc) -> Controller:
    config = Config(controller=ControllerConfig(id="c0", **cc))
    return Controller(config) if clock is None else Controller(config, clock=clock)


async def test_a_stuck_leader_loop_stops_the_controller():
    clock = FakeClock()
    c = _controller(clock, leader_exit_s=0.3)
    c.leader = SimpleNamespace(last_beat=clock.monotonic(), fence=5)
    watchdog = asyncio.create_task(c._watchdog())
    try:
        await clock.advance(0.25)
        assert not c._supervisor.has_failed, "stopped within the bound"
        await clock.advance(0.25)
        reason = await asyncio.wait_for(c.failed(), 3.0)
    finally:
        await cancel_and_wait([watchdog])
    assert "no progress" in reason and "0.3" in reason


async def test_a_beating_leader_loop_and_a_standby_are_left_alone():
    clock = FakeClock()
    c = _controller(clock, leader_exit_s=0.3)
    leader = SimpleNamespace(last_beat=clock.monotonic(), fence=5)
    c.leader = leader
    watchdog = asyncio.create_task(c._watchdog())
    try:
        for _ in range(10):  # 1 s, over three times the bound
            leader.last_beat = clock.monotonic()
            await clock.advance(0.1)
        c.leader = None  # a standby: no loop to watch
        await clock.advance(5.0)
        assert not c._supervisor.has_failed
    finally:
        await cancel_and_wait([watchdog])


async def test_a_leader_loop_whose_tasks_will_not_stop_stops_the_controller(monkeypatch):
    class WedgedLeader:
        def __init__(self, *args):
            self.last_beat, self.fence = time.monotonic(), 9

        async def run(self):
            raise StuckTasksError("tasks still running 10s after being cancelled: leader-events")

    monkeypatch.setattr(service, "Leader", WedgedLeader)
    c = _controller()
    elected = asyncio.Event()
    elected.set()
    c.election = SimpleNamespace(elected=elected)
    c.jobs = c.nodes = c.settings = None
    task = asyncio.create_task(c._lead_when_elected(None, SimpleNamespace(jobs=None, assign=None)))
    reason = await asyncio.wait_for(c.failed(), 2.0)
    await asyncio.wait_for(task, 1.0)  # it does not retry a loop it cannot stop
    assert "leader-events" in reason and c.leader is None
