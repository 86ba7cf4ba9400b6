"""Time as a dependency: the election, the leader and the agent read the time and sleep through a
:class:`Clock`, so their timing tests run on a :class:`FakeClock` that moves only when the test
says so, instead of racing real sleeps against a loaded machine."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds (records, leases' ``since``)."""

    def monotonic(self) -> float:
        """Seconds for intervals and deadlines within this process."""

    def boottime(self) -> float:
        """Seconds since the host booted, counting time suspended (``CLOCK_BOOTTIME``): the same in
        every process of one boot and never stepped, so a deadline stamped by one process (an agent
        since restarted, a launcher) holds in another. Stamps kept on disk use it; the wall clock
        is only for showing when."""

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def boottime(self) -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM = SystemClock()


class FakeClock:
    """A clock that stands still until :meth:`advance`; ``sleep`` waits for the fake time to pass.

    ``time()`` is ``monotonic()`` plus ``wall_offset``, which a test may change to step the wall
    clock alone; ``boottime()`` is ``monotonic()``: neither moves when the wall clock is stepped.
    """

    def __init__(self, start: float = 1000.0, wall_offset: float = 1.7e9) -> None:
        self.now = start
        self.wall_offset = wall_offset
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now + self.wall_offset

    def monotonic(self) -> float:
        return self.now

    def boottime(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._order), fut))
        await fut

    @property
    def sleepers(self) -> int:
        """Tasks now waiting in :meth:`sleep`."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    async def settle(self, rounds: int = 20) -> None:
        """Let every runnable task run until it waits again (on this clock or on I/O)."""
        for _ in range(rounds):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, waking each sleeper at its own deadline, in order, and
        letting it run before time moves past the next deadline (a loop that sleeps again in the
        meantime is woken again within the same call)."""
        until = self.now + seconds
        await self.settle()
        while self._sleepers and self._sleepers[0][0] <= until:
            deadline, _, fut = heapq.heappop(self._sleepers)
            self.now = max(self.now, deadline)
            if not fut.done():
                fut.set_result(None)
            await self.settle()
        self.now = until
        await self.settle()
