"""When the leader's round also explains every wait (controller/leader.py ExplainThrottle): every
``explain_interval_s``, sooner for a job that waits without a reason, never in a burst."""

from __future__ import annotations

import pytest

from hfai.controller.leader import ExplainThrottle


@pytest.mark.parametrize("rounds, expected", [
    # (monotonic time, a job waits without a reason) per round -> explains?
    ([(0.0, False)], [True]),  # the first round of a term explains
    ([(0.0, False), (1.0, False), (2.0, False), (3.9, False), (4.0, False)], [True, False, True, False, True]),
    # A new waiter is explained at once, but a stream of them at most every 0.25 s.
    ([(0.0, False), (0.1, True), (0.3, True), (0.4, True), (0.55, True)], [True, False, True, False, True]),
    # Without new waiters the interval counts from the last explaining round, whatever made it.
    ([(0.0, False), (0.5, True), (2.0, False), (2.5, False)], [True, True, False, True]),
])
def test_explaining_rounds(rounds, expected):
    throttle = ExplainThrottle(every_s=2.0, new_every_s=0.25)
    assert [throttle.due(now, unexplained) for now, unexplained in rounds] == expected
