"""One restart policy for every daemon of a local cluster and every reason to restart one (issue 38
§8): the pure decision (hfai.cli.local.supervision.restart_step) as a table, and a daemon's track through
deaths and store faults alike, bounded by the same "``burst`` in ``window_s``"."""

from __future__ import annotations

import pytest

from hfai.cli.local.supervision import Step, SupervisePolicy, Track, restart_step, store_restart_due

P = SupervisePolicy(first_delay_s=1.0, max_delay_s=8.0, burst=3, window_s=100.0, steady_s=20.0)


@pytest.mark.parametrize("restarts, streak, due_since, now, step", [
    ([], 0, 10.0, 10.0, Step.NOTHING),  # due this moment: wait the first delay
    ([], 0, 10.0, 10.9, Step.NOTHING),
    ([], 0, 10.0, 11.0, Step.RESTART),
    ([5.0], 1, 10.0, 11.9, Step.NOTHING),  # the second restart in a row waits twice as long
    ([5.0], 1, 10.0, 12.0, Step.RESTART),
    ([1.0, 2.0, 3.0], 3, 10.0, 17.9, Step.NOTHING),  # 8 s, the cap, not yet passed
    ([1.0, 2.0, 3.0], 3, 10.0, 18.0, Step.GIVE_UP),  # a fourth within 100 s: given up on
    ([1.0, 2.0, 3.0], 3, 200.0, 208.0, Step.RESTART),  # those three left the window
    ([-50.0, 60.0, 70.0], 2, 80.0, 84.0, Step.RESTART),  # two within it
    ([], 10, 0.0, 7.9, Step.NOTHING),  # a long streak waits the cap, no more
    ([], 10, 0.0, 8.0, Step.RESTART),
])
def test_the_restart_policy(restarts, streak, due_since, now, step):
    assert restart_step(restarts, streak, due_since, now, P) is step


def test_restarts_for_the_store_and_for_deaths_share_one_bound_and_one_backoff():
    """The 8 restarts of nats-server in 2 minutes: each store restart went around the bound."""
    t = Track(started=0.0)
    assert t.see(False, 10.0, P, "killed by SIGKILL") is Step.NOTHING
    assert t.see(False, 11.0, P) is Step.RESTART
    t.restarted(11.0)
    # Its store judged broken right after: the restart waits the doubled delay (2 s), not 1 s.
    assert t.fault(12.0, P, "its store refused writes (x)") is Step.NOTHING
    assert t.fault(13.9, P, "its store refused writes (y)") is Step.NOTHING
    assert t.fault(14.0, P, "its store refused writes (z)") is Step.RESTART
    assert t.last_exit == "its store refused writes (x)"  # the reason seen when it became due
    t.restarted(14.0)
    assert t.fault(15.0, P, "its store refused writes") is Step.NOTHING
    assert t.fault(18.9, P, "") is Step.NOTHING and t.fault(19.0, P, "") is Step.RESTART  # 4 s
    t.restarted(19.0)
    # Three restarts within the window, for whatever reasons: the next one due is given up on.
    assert t.see(False, 20.0, P, "exited with status 1") is Step.NOTHING
    assert t.see(False, 27.9, P) is Step.NOTHING
    assert t.see(False, 28.0, P) is Step.GIVE_UP and t.gave_up and t.last_exit == "exited with status 1"
    assert t.fault(500.0, P, "its store refused writes") is Step.NOTHING and t.total == 3


def test_a_fault_that_passed_leaves_no_restart_due():
    t = Track(started=0.0)
    assert t.fault(10.0, P, "its store refused writes") is Step.NOTHING
    t.well()
    assert t.see(True, 30.0, P) is Step.NOTHING
    # Due again later: its delay counts from then, not from the first time.
    assert t.fault(40.0, P, "its store refused writes") is Step.NOTHING
    assert t.fault(41.0, P, "its store refused writes") is Step.RESTART


def test_a_restart_simulated_over_two_minutes_of_a_store_that_never_recovers_stays_within_the_bound():
    """The supervisor's loop on a made-up clock: every tick the store's fault is judged afresh
    (``store_restart_due``: once the new server had time for its probes) and the policy decides."""
    p = SupervisePolicy(tick_s=0.5, first_delay_s=1.0, max_delay_s=30.0, burst=5, window_s=300.0,
                        store_probe_s=2.0, store_probe_timeout_s=3.0, store_probe_failures=3)
    t, now, restarted_at = Track(started=0.0), 0.0, []
    while now < 120.0:
        if store_restart_due(False, None, p, t.started, now):
            if t.fault(now, p, "its store refused writes") is Step.RESTART:
                t.restarted(now)
                restarted_at.append(now)
        now += p.tick_s
    assert len(restarted_at) <= p.burst, restarted_at
    gaps = [b - a for a, b in zip(restarted_at, restarted_at[1:], strict=False)]
    assert all(b > a for a, b in zip(gaps, gaps[1:], strict=False)), gaps  # each waits longer than the last
