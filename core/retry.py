"""Jittered exponential backoff, the one retry schedule of the daemons and clients.

Fixed delays make a fleet retry in lockstep: after a NATS restart a thousand agents that all wait
0.5 s reconnect, fail and retry in the same instant, again and again. Each delay here is drawn
from ``[d/2, d]`` where ``d`` doubles from ``base_s`` up to ``cap_s`` ("equal jitter": never a
tight zero-delay loop, and the herd spreads over half the window).
"""

from __future__ import annotations

import random
from collections.abc import Callable


def delay(attempt: int, base_s: float, cap_s: float, rand: Callable[[], float] = random.random) -> float:
    """Pure given ``rand``: the wait before retry number ``attempt`` (0 = the first retry)."""
    ceiling = min(cap_s, base_s * (2 ** min(attempt, 62)))
    return ceiling / 2 + rand() * ceiling / 2


class Backoff:
    """Successive delays of one retrying loop; :meth:`reset` after a success."""

    def __init__(self, base_s: float, cap_s: float, rand: Callable[[], float] = random.random) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError(f"backoff needs 0 < base_s <= cap_s, got base_s={base_s} cap_s={cap_s}")
        self.base_s = base_s
        self.cap_s = cap_s
        self.attempt = 0
        self._rand = rand

    def next(self) -> float:
        d = delay(self.attempt, self.base_s, self.cap_s, self._rand)
        self.attempt += 1
        return d

    def reset(self) -> None:
        self.attempt = 0
