"""Polling waits the tests share: until a condition holds, or until a file has been written; and
the one place a test's real sleeps are counted against a budget (tests/test_sleeps_budget.py):
waiting here for a real process is not waiting for time to pass."""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path


def wait_for(cond, timeout: float, what: str, poll: float = 0.1):
    """``cond()``'s first true value, polled every ``poll`` s; an AssertionError naming ``what``
    after ``timeout`` s. An exception from ``cond`` counts as not yet (the API is briefly
    unavailable during a failover) and is named in the error."""
    deadline = time.monotonic() + timeout
    last_error = None
    while time.monotonic() < deadline:
        try:
            value = cond()
            if value:
                return value
        except Exception as e:
            last_error = e
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what} (last error: {last_error})")


async def until(cond, timeout: float, what: str, poll: float = 0.05):
    """:func:`wait_for` inside an event loop: ``cond()`` (a value or a coroutine's) polled every
    ``poll`` s without blocking the loop. Exceptions from ``cond`` propagate: the callers poll
    local state, where an error is a failure, not "not yet"."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        await asyncio.sleep(poll)


async def settle(rounds: int = 20) -> None:
    """Let every runnable task run until it waits again: no time passes (a task just created has
    reached its first await)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


def wait_for_file(path: Path, timeout: float = 20.0) -> str:
    """The text of ``path`` once it exists and is not empty (a job writes it as it starts)."""
    return wait_for(lambda: path.exists() and path.read_text(), timeout, f"{path} to be written", poll=0.02)
