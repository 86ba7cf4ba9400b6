"""The agent's pure reconciliation plan: start once, interrupt windows, stop, report, clean up."""

from __future__ import annotations

from dataclasses import replace

from hfai.agent.plan import ACK_EXIT_GRACE_S, Act, LocalRun, RunPhase, plan
from hfai.protocol.types import DesiredRun, RunAssignment, RunEventKind

RA = RunAssignment(job_id="j", run_id=1, name="n", user="u", group="g", priority=10, rank=0, world_size=1,
                   master_addr="a", master_port=1, entrypoint=("true",), workdir="/", desired=DesiredRun.RUN,
                   ack_window_s=10.0, kill_window_s=3.0)
ALL_SENT = frozenset({RunEventKind.STARTED})


def acts(desired, local, now=100.0):
    return [(a.act, a.key) for a in plan(desired, local, now)]


def local(**kw) -> LocalRun:
    return LocalRun(**{"key": RA.key, "assignment": RA, "phase": RunPhase.ALIVE, "sent": ALL_SENT, **kw})


def test_start_only_runs_this_node_never_had():
    assert acts({RA.key: RA}, {}) == [(Act.START, RA.key)]
    assert acts({RA.key: RA}, {RA.key: local()}) == []
    done = local(phase=RunPhase.EXITED, exit_code=0, sent=ALL_SENT | {RunEventKind.EXITED})
    assert acts({RA.key: RA}, {RA.key: done}) == []


def test_suspend_windows():
    s = replace(RA, desired=DesiredRun.SUSPEND)
    assert acts({s.key: s}, {s.key: local()}) == [(Act.RAISE_SUSPEND, s.key)]
    assert acts({s.key: s}, {s.key: local(suspend_ts=95.0)}) == []
    assert acts({s.key: s}, {s.key: local(suspend_ts=89.0)}) == [(Act.TERMINATE, s.key)]  # ack window over
    acked = local(suspend_ts=99.0, acked=True, ack_ts=99.5)
    assert acts({s.key: s}, {s.key: acked}) == [(Act.REPORT_ACK, s.key)]  # it exits by itself, normally
    late = local(suspend_ts=95.0, acked=True, ack_ts=97.0, sent=ALL_SENT | {RunEventKind.SUSPEND_ACKED})
    assert [a.act for a in plan({s.key: s}, {s.key: late}, 100.0, ack_exit_grace_s=2.0)] == [Act.TERMINATE]
    assert acts({s.key: s}, {s.key: local(suspend_ts=80.0, term_ts=98.0)}) == []
    assert acts({s.key: s}, {s.key: local(suspend_ts=80.0, term_ts=96.0)}) == [(Act.KILL, s.key)]


def test_an_acked_job_gets_seconds_to_exit_unless_it_asks_to_be_stopped():
    """Issue 13: a job with spawned workers acks before its parent exits; a SIGTERM 2 s after the
    ack turned its clean exit into -15. go_suspend(exit=False) asks for the stop: no grace."""
    s = replace(RA, desired=DesiredRun.SUSPEND)
    sent = ALL_SENT | {RunEventKind.SUSPEND_ACKED}
    exiting = local(suspend_ts=90.0, acked=True, ack_ts=95.0, sent=sent)
    assert acts({s.key: s}, {s.key: exiting}) == []  # 5 s after the ack: still exiting by itself
    assert acts({s.key: s}, {s.key: exiting}, now=95.0 + ACK_EXIT_GRACE_S) == [(Act.TERMINATE, s.key)]
    stop_me = replace(exiting, ack_stop=True)
    assert acts({s.key: s}, {s.key: stop_me}, now=95.0) == [(Act.TERMINATE, s.key)]


def test_a_killed_run_is_killed_again_until_it_is_gone_and_never_sent_sigterm():
    s = replace(RA, desired=DesiredRun.SUSPEND)
    killed = local(suspend_ts=80.0, term_ts=90.0, killed=True)
    assert acts({s.key: s}, {s.key: killed}) == [(Act.KILL, s.key)]
    assert acts({}, {RA.key: killed}) == [(Act.KILL, RA.key)]
    # SIGKILLed outside the plan, with no SIGTERM before: no kill window to wait out.
    assert acts({}, {RA.key: local(killed=True)}) == [(Act.KILL, RA.key)]


def test_a_run_sent_sigterm_without_a_flag_gets_its_flag_once_it_is_to_be_suspended():
    """Stopped as no longer wanted, then held suspended (agent/operations.py): the flag still lets
    it checkpoint before its SIGKILL, which follows at the next plan."""
    s = replace(RA, desired=DesiredRun.SUSPEND)
    assert acts({s.key: s}, {s.key: local(term_ts=90.0)}) == [(Act.RAISE_SUSPEND, s.key)]
    assert acts({s.key: s}, {s.key: local(term_ts=90.0, suspend_ts=99.0)}) == [(Act.KILL, s.key)]


def test_exit_is_reported_once_and_unwanted_runs_are_stopped_then_cleaned():
    gone = local(phase=RunPhase.EXITED, exit_code=0)
    assert acts({RA.key: RA}, {RA.key: gone}) == [(Act.REPORT_EXIT, RA.key)]
    assert acts({}, {RA.key: local()}) == [(Act.TERMINATE, RA.key)]
    assert acts({}, {RA.key: local(term_ts=90.0)}) == [(Act.KILL, RA.key)]
    assert acts({}, {RA.key: gone}) == [(Act.REPORT_EXIT, RA.key)]
    reported = replace(gone, sent=ALL_SENT | {RunEventKind.EXITED})
    assert acts({}, {RA.key: reported}) == [(Act.CLEANUP, RA.key)]


def test_suspended_before_start_is_reported_not_started():
    s = replace(RA, desired=DesiredRun.SUSPEND)
    assert acts({s.key: s}, {}) == [(Act.REPORT_NEVER_RAN, s.key)]


def test_stale_logs_keep_recent_and_live_jobs():
    from hfai.agent.plan import stale_logs

    last = {"old": 100.0, "recent": 950.0, "old-but-running": 50.0}
    assert stale_logs(last, {"old-but-running"}, now=1000.0, retention_s=500.0) == ["old"]
    assert stale_logs(last, set(), now=1000.0, retention_s=0) == []


def test_only_an_ack_that_says_stop_skips_the_grace():
    from hfai.agent.runs import _asks_to_stop

    assert _asks_to_stop(b"123 1700000000.5 stop\n")
    assert not any(_asks_to_stop(a) for a in (b"123 1700000000.5 exit\n", b"123 1700000000.5\n", b"", None,
                                               b"stop", b"1 2 stopped"))
