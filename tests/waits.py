"""Polling waits the tests share: until a condition holds, or until a file has been written."""

from __future__ import annotations

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


def wait_for_file(path: Path, timeout: float = 20.0) -> str:
    """The text of ``path`` once it exists and is not empty (a job writes it as it starts)."""
    return wait_for(lambda: path.exists() and path.read_text(), timeout, f"{path} to be written", poll=0.02)
