"""The shared fake clock and the jittered backoff (hfai.core.clock, hfai.core.retry)."""

import asyncio

import pytest

from hfai.core.clock import FakeClock
from hfai.core.retry import Backoff, delay


def test_delay_doubles_up_to_the_cap_within_half_to_full():
    assert [delay(n, 0.5, 4.0, lambda: 1.0) for n in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert [delay(n, 0.5, 4.0, lambda: 0.0) for n in range(4)] == [0.25, 0.5, 1.0, 2.0]


def test_backoff_resets_and_spreads_a_herd():
    b = Backoff(0.5, 8.0)
    first = [b.next() for _ in range(3)]
    b.reset()
    assert b.next() <= 0.5 and first[2] <= 2.0
    herd = {round(Backoff(0.5, 8.0).next(), 6) for _ in range(200)}
    assert len(herd) > 150  # not lockstep
    with pytest.raises(ValueError):
        Backoff(0, 1)


async def test_fake_clock_wakes_sleepers_in_deadline_order():
    clock = FakeClock(start=0.0)
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, s: float) -> None:
        await clock.sleep(s)
        woke.append((name, clock.monotonic()))

    tasks = [asyncio.create_task(sleeper("b", 2.0)), asyncio.create_task(sleeper("a", 1.0))]
    await clock.advance(0.5)
    assert woke == [] and clock.sleepers == 2
    await clock.advance(5.0)
    assert woke == [("a", 1.0), ("b", 2.0)] and clock.monotonic() == 5.5
    assert clock.time() - clock.monotonic() == clock.wall_offset
    await asyncio.gather(*tasks)


async def test_fake_clock_wakes_a_loop_every_period_within_one_advance():
    clock = FakeClock(start=0.0)
    ticks: list[float] = []

    async def loop() -> None:
        while True:
            await clock.sleep(1.0)
            ticks.append(clock.monotonic())

    t = asyncio.create_task(loop())
    await clock.advance(3.5)
    assert ticks == [1.0, 2.0, 3.0]
    t.cancel()
