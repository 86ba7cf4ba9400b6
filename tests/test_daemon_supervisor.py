"""Supervised daemon tasks and the one watch-and-rewatch loop (issue 12), without NATS.

A daemon's long-lived task that ends on its own (an error, a return, a stray cancellation) fails
the daemon, so it exits non-zero for systemd to restart it instead of looking healthy while doing
nothing; ``_nats.follow`` watches a KV key or bucket anew when its watch fails or ends, and lets an
error of its own handler end the task."""

from __future__ import annotations

import asyncio
import logging

import nats.errors
import pytest
from waits import settle, until

from hfai.core import nats as _nats
from hfai.core.daemon import EXIT_FAILED, Supervisor, serve


async def _forever() -> None:
    await asyncio.Event().wait()


async def _raise_soon(error: Exception) -> None:
    await settle()  # after the others have started
    raise error


async def test_a_task_that_fails_fails_the_daemon(caplog):
    sup = Supervisor()
    sup.spawn(_forever(), "steady")
    sup.spawn(_raise_soon(IsADirectoryError(21, "Is a directory", "fence")), "assignment-watch")
    with caplog.at_level(logging.ERROR, logger="hfai.core.daemon"):
        reason = await asyncio.wait_for(sup.failed(), 2.0)
    assert reason.startswith("task assignment-watch failed: IsADirectoryError") and "fence" in reason
    assert any(r.exc_info for r in caplog.records), "the traceback is logged"
    await sup.stop()
    assert all(t.done() for t in sup.tasks)


async def test_a_task_that_returns_or_is_cancelled_by_someone_else_fails_the_daemon():
    async def quits():
        await asyncio.sleep(0)

    sup = Supervisor()
    sup.spawn(quits(), "gc")
    assert await asyncio.wait_for(sup.failed(), 2.0) == "task gc ended"
    await sup.stop()

    sup = Supervisor()
    stray = sup.watch(asyncio.create_task(_forever(), name="kvcache-hfai_jobs"))
    stray.cancel()
    assert await asyncio.wait_for(sup.failed(), 2.0) == "task kvcache-hfai_jobs was cancelled"


async def test_the_first_reason_wins_and_stop_is_no_failure():
    sup = Supervisor()
    sup.spawn(_forever(), "a")
    watched = sup.watch(asyncio.create_task(_forever(), name="b"))
    await settle()
    await sup.stop()
    watched.cancel()  # its owner stops it after the supervisor: not a failure
    await settle()
    assert not sup.has_failed

    sup = Supervisor()
    sup.fail("first")
    sup.fail("second")
    assert await sup.failed() == "first"


async def test_serve_exits_failed_when_a_supervised_task_dies():
    sup = Supervisor()
    closed = []

    async def start():
        sup.spawn(_forever(), "heartbeat")
        sup.spawn(_raise_soon(RuntimeError("boom")), "reconcile")

    async def close():
        closed.append(True)
        await sup.stop()

    code = await asyncio.wait_for(serve(start, close, sup.failed, hard_exit=lambda c: None), 5.0)
    assert code == EXIT_FAILED and closed
    assert "reconcile" in sup.reason and "boom" in sup.reason


# ------------------------------------------------------------------------- watch and rewatch

class FakeWatcher:
    """Delivers ``entries`` (None: the end of the snapshot marker); then ends, raises ``error``,
    or waits (``hold``) until stopped, as a nats-py KeyWatcher does."""

    def __init__(self, entries, error: Exception | None = None, hold: bool = False):
        self.entries = list(entries)
        self.error = error
        self.hold = hold
        self.stopped = asyncio.Event()

    async def stop(self):
        self.stopped.set()

    def __aiter__(self):
        return self._gen()

    async def _gen(self):
        for e in self.entries:
            yield e
        if self.error is not None:
            raise self.error
        if self.hold:
            await self.stopped.wait()


async def test_follow_watches_anew_after_a_failed_open_an_end_and_an_error():
    ended = FakeWatcher(["a", None, "b"])
    failing = FakeWatcher(["c"], error=nats.errors.TimeoutError())
    last = FakeWatcher(["d", None], hold=True)
    opens = [nats.errors.NoRespondersError(), failing, last]
    opened = []

    async def open_watch():
        item = opens.pop(0)
        if isinstance(item, Exception):
            raise item
        opened.append(item)
        return item

    seen, watches = [], []
    task = asyncio.create_task(_nats.follow(open_watch, seen.append, "test", on_watch=lambda: watches.append(len(seen)),
                                            watcher=ended, retry_s=0.01))
    await until(lambda: seen[-2:] == ["d", None], 2.0, "the last watch's snapshot", poll=0.01)
    assert seen == ["a", None, "b", "c", "d", None]
    assert watches == [0, 3, 4]  # before each watch delivers anything
    assert ended.stopped.is_set() and failing.stopped.is_set() and not last.stopped.is_set()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert last.stopped.is_set(), "the current watch is stopped on the way out"


async def test_follow_lets_its_handlers_errors_end_it():
    watcher = FakeWatcher(["x"], hold=True)

    def handle(entry):
        raise PermissionError(13, "Permission denied", "fence")

    async def never():
        raise AssertionError("a fault of ours is no reason to watch again")

    with pytest.raises(PermissionError):
        await asyncio.wait_for(_nats.follow(never, handle, "test", watcher=watcher, retry_s=0.01), 2.0)
    assert watcher.stopped.is_set()


# ---------------------------------------------------------------------- a controller, wired up

async def test_a_controller_whose_cache_or_lease_task_dies_fails(nats_url):
    """Each long-lived task a controller relies on is watched, its KV caches' and lease's too."""
    from hfai.controller.service import Controller
    from hfai.core.config import Config, ControllerConfig, NatsConfig

    for victim in ("jobs", "lease"):
        c = Controller(Config(nats=NatsConfig(url=nats_url), controller=ControllerConfig(id="c0", lease_ttl_s=2.0)))
        await c.start()
        try:
            task = c.jobs.task if victim == "jobs" else c.election._task
            task.cancel()  # as if it had ended on its own
            reason = await asyncio.wait_for(c.failed(), 5.0)
        finally:
            await c.close()
        assert reason == f"task {task.get_name()} was cancelled", reason


def test_a_failure_streak_ends_at_its_limit_and_a_success_resets_it():
    from hfai.core.daemon import FailureStreak

    streak = FailureStreak(3)
    assert not streak.failed() and not streak.failed()
    streak.succeeded()
    assert [streak.failed() for _ in range(3)] == [False, False, True]
    never = FailureStreak(0)
    assert not any(never.failed() for _ in range(100))


async def test_an_agent_whose_reconcile_keeps_failing_on_local_state_stops(tmp_path):
    """A disk that stays broken (read-only) stops the agent (its supervisor then exits the process) instead of
    leaving a node that heartbeats but never runs work; a NATS error is retried for ever."""
    import dataclasses

    from hfai.agent.service import Agent
    from hfai.agent.statefile import LocalStateError
    from hfai.core.config import AgentConfig, Config

    # A round NATS refused is retried after a backoff capped at one heartbeat interval: short here.
    config = Config(agent=dataclasses.replace(AgentConfig(), node="n0", state_dir=str(tmp_path),
                                              reconcile_interval_s=0.001, reconcile_failures_max=5,
                                              heartbeat_interval_s=0.01))
    agent = Agent(config)
    calls = []

    async def broken() -> None:
        calls.append(1)
        raise OSError(30, "Read-only file system")  # (a full disk drains the node instead: test_fault_disk)

    agent.reconciler.reconcile = broken  # type: ignore[method-assign]
    with pytest.raises(LocalStateError, match="5 times in a row"):
        await asyncio.wait_for(agent.reconciler.loop(), 10)
    assert len(calls) == 5

    async def nats_down() -> None:
        calls.append(1)
        if len(calls) > 50:
            raise asyncio.CancelledError
        raise nats.errors.ConnectionClosedError

    agent.reconciler.reconcile = nats_down  # type: ignore[method-assign]
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(agent.reconciler.loop(), 10)
    assert len(calls) > 50
