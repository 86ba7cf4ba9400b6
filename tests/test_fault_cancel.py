"""Cancellation that cannot hang (issue 11): Python 3.11's ``asyncio.wait_for`` returns the inner
result instead of raising when cancelled just as that result is ready, and nats-py awaits it
inside every fetch and request. The leader's event consumer swallowed a cancellation that way and
kept fetching, and the leader waited for it for ever while its lease was renewed.

These tests make the race deterministic: a fetch whose result is set in the same loop iteration
as the consumer is cancelled.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from fakes import FakeElection
from waits import settle

from hfai.controller.leader import Leader
from hfai.core.config import Config
from hfai.core.daemon import (
    EXIT_FAILED,
    EXIT_WEDGED,
    StuckTasksError,
    bounded,
    cancel_and_wait,
    raise_if_cancelled,
    serve,
)


class ReadyAsCancelledPsub:
    """A pull subscription whose fetch blocks until the test completes it."""

    def __init__(self):
        self.release: asyncio.Future | None = None
        self.fetches = 0
        self.unsubscribed = False

    async def fetch(self, batch, timeout=None):
        self.fetches += 1
        self.release = asyncio.get_running_loop().create_future()
        return await self.release

    async def unsubscribe(self):
        self.unsubscribed = True


async def _fetching(psub: ReadyAsCancelledPsub) -> None:
    while psub.release is None:
        await asyncio.sleep(0)


async def test_event_consumer_stops_when_cancelled_as_its_fetch_completes():
    leader = Leader(Config(), None, None, None, None, None, FakeElection(), asyncio.Event())
    psub = ReadyAsCancelledPsub()
    task = asyncio.create_task(leader._consume_events(psub))
    await _fetching(psub)
    psub.release.set_result([])  # the fetch's result is ready...
    task.cancel()                # ...as the cancellation arrives
    done, _ = await asyncio.wait({task}, timeout=2.0)
    assert done, f"the consumer swallowed its cancellation and fetched again ({psub.fetches} fetches)"
    assert task.cancelled() and psub.unsubscribed


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's wait_for no longer swallows cancellations")
async def test_the_311_wait_for_race_itself():
    """What bit the leader: wait_for returns the result and the caller never sees its cancel."""
    release = asyncio.get_running_loop().create_future()

    async def caller():
        return await asyncio.wait_for(release, 5.0)

    task = asyncio.create_task(caller())
    await settle()
    release.set_result("late")
    task.cancel()
    assert await asyncio.wait({task}, timeout=1.0)
    assert not task.cancelled() and task.result() == "late" and task.cancelling() == 1


async def test_bounded_propagates_a_cancellation_that_arrives_with_the_result():
    release = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(bounded(release, 5.0))
    await settle()
    release.set_result("late")
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    assert task.cancelled()


async def test_bounded_times_out_and_cancels_what_it_waited_for():
    inner = asyncio.get_running_loop().create_future()
    with pytest.raises(asyncio.TimeoutError):
        await bounded(inner, 0.05)
    assert inner.cancelled()
    assert await bounded(asyncio.sleep(0, "ok"), 1.0) == "ok"


async def test_raise_if_cancelled_catches_a_swallowed_cancellation():
    swallowed = asyncio.Event()

    async def loop():
        while True:
            raise_if_cancelled()
            try:
                await asyncio.Event().wait()  # until cancelled
            except asyncio.CancelledError:
                swallowed.set()  # what a swallowing await looks like from the outside

    task = asyncio.create_task(loop())
    await settle()
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    assert swallowed.is_set() and task.cancelled()


async def test_cancel_and_wait_cancels_again_a_task_that_swallowed_once():
    async def swallow_once():
        try:
            await asyncio.Event().wait()  # until cancelled
        except asyncio.CancelledError:
            pass
        await asyncio.Event().wait()

    task = asyncio.create_task(swallow_once(), name="swallow-once")
    await settle()
    await cancel_and_wait([task], timeout_s=5.0)
    assert task.cancelled()


async def test_cancel_and_wait_gives_up_on_a_task_that_never_stops():
    released = asyncio.Event()

    async def immortal():
        while not released.is_set():
            try:
                await released.wait()
            except asyncio.CancelledError:
                pass

    task = asyncio.create_task(immortal(), name="immortal")
    await settle()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(StuckTasksError, match="immortal"):
        await cancel_and_wait([task], timeout_s=0.5)
    assert loop.time() - t0 < 2.0
    released.set()  # let the test's event loop close
    await task


async def test_serve_returns_failed_status_when_the_daemon_fails():
    reason = asyncio.Event()
    closed = []

    async def start():
        asyncio.get_running_loop().call_later(0.05, reason.set)

    async def failed():
        await reason.wait()
        return "the leader loop made no progress"

    async def close():
        closed.append(True)

    assert await serve(start, close, failed, shutdown_timeout_s=1.0) == EXIT_FAILED
    assert closed == [True]


async def test_serve_exits_at_once_when_close_hangs():
    exits = []

    async def start():
        pass

    async def failed():
        return "stuck"

    async def close():
        raise StuckTasksError("tasks still running: leader-events")

    await serve(start, close, failed, shutdown_timeout_s=1.0, hard_exit=exits.append)
    assert exits == [EXIT_WEDGED]

    async def slow_close():
        await asyncio.Event().wait()  # never done

    exits.clear()
    await serve(start, slow_close, failed, shutdown_timeout_s=0.1, hard_exit=exits.append)
    assert exits == [EXIT_WEDGED]
