"""The time-sharing timeline (web/timeline.py) and the quotas table with no quota set (pure)."""

from __future__ import annotations

from hfai.controller.policy import Start, Suspend
from hfai.controller.transitions import apply_start, apply_suspend, requeue
from hfai.protocol import reasons
from hfai.protocol.reasons import Reason
from hfai.protocol.types import ChainState, JobEvent, JobRecord, JobSpec, QuotaEntry, QuotaTable, evolve
from hfai.web import views
from hfai.web.timeline import PALETTE, MarkKind, job_timeline, mark_kind, timeline

T0 = 1_750_000_000.0
Q, R, SG, SD, OK = (ChainState.QUEUED, ChainState.RUNNING, ChainState.SUSPENDING, ChainState.SUSPENDED,
                    ChainState.SUCCEEDED)


def record(jid="j1", name="train", user="alice", nodes=2, priority=10) -> JobRecord:
    spec = JobSpec(name=name, entrypoint=("x",), workdir="/", nodes=nodes, priority=priority, user=user)
    return JobRecord(id=jid, spec=spec, state=Q, submit_ts=T0, history=(JobEvent(ts=T0, state=Q),))


def preempted_and_resumed() -> JobRecord:
    """Built with the controller's own transitions, so the reasons are the ones it writes."""
    j = apply_start(record(), Start("j1", ("n1", "n2")), T0 + 10, "n1", 1)
    assert j is not None
    j = apply_suspend(j, Suspend("j1", reasons.preempted(job="h", priority="HIGH", victim_priority="LOW"),
                                 for_job="h"), T0 + 100)
    assert j is not None
    j = requeue(j, T0 + 104, reasons.acknowledged(cause=j.reason))
    j = apply_start(j, Start("j1", ("n3", "n1")), T0 + 200, "n3", 1)
    assert j is not None
    j = apply_suspend(j, Suspend("j1", reasons.time_slice(job="k", minutes=1.0), for_job="k",
                                 sliced=True), T0 + 260)
    assert j is not None
    return requeue(j, T0 + 275, reasons.not_acknowledged(cause=j.reason))


def test_runs_become_bars_on_the_nodes_the_controller_named():
    segs, _ = job_timeline(preempted_and_resumed(), now=T0 + 1000)
    assert [(s.run, s.nodes, s.start, s.end, s.ongoing) for s in segs] == [
        (1, ("n1", "n2"), T0 + 10, T0 + 104, False), (2, ("n3", "n1"), T0 + 200, T0 + 275, False)]


def test_each_preemption_time_slice_ack_and_resume_is_marked_on_its_nodes():
    _, marks = job_timeline(preempted_and_resumed(), now=T0 + 1000)
    assert [(m.kind, m.ts, m.nodes) for m in marks] == [
        (MarkKind.PREEMPTED, T0 + 100, ("n1", "n2")), (MarkKind.ACKNOWLEDGED, T0 + 104, ("n1", "n2")),
        (MarkKind.RESUMED, T0 + 200, ("n3", "n1")), (MarkKind.TIME_SLICE, T0 + 260, ("n3", "n1")),
        (MarkKind.NOT_ACKNOWLEDGED, T0 + 275, ("n3", "n1"))]
    assert marks[0].reason.startswith("preempted by job h")


def test_a_running_job_is_drawn_up_to_now_and_unknown_reasons_still_show():
    j = apply_start(record(), Start("j1", ("n1",)), T0 + 10, "n1", 1)
    assert j is not None
    segs, _ = job_timeline(j, now=T0 + 50)
    assert [(s.start, s.end, s.ongoing) for s in segs] == [(T0 + 10, T0 + 50, True)]
    assert mark_kind(SG, None) is MarkKind.INTERRUPTED  # a reason in words only ("requeued by alice")
    assert mark_kind(SG, Reason("a_code_of_a_later_controller")) is MarkKind.INTERRUPTED
    assert mark_kind(SD, None) is None  # marked when interrupted
    assert mark_kind(R, reasons.started(nodes="n1")) is None


def test_a_history_cut_inside_a_run_keeps_that_run_on_the_latest_nodes():
    j = apply_start(record(), Start("j1", ("n1",)), T0 + 10, "n1", 1)
    assert j is not None
    j = j.transition(SG, T0 + 20, "requeued by bob")
    cut = evolve(j, history=j.history[-1:])
    segs, marks = job_timeline(cut, now=T0 + 30)
    assert [(s.run, s.nodes, s.start, s.ongoing) for s in segs] == [(1, ("n1",), T0 + 10, True)]
    assert [m.kind for m in marks] == [MarkKind.INTERRUPTED]


def test_the_cluster_timeline_clips_to_its_window_one_colour_per_job_and_keeps_every_node_a_row():
    a = preempted_and_resumed()
    b = apply_start(record("j2", "eval", "bob", nodes=1), Start("j2", ("n9",)), T0 + 150, "n9", 1)
    assert b is not None
    tl = timeline([a, b, record("j3", "idle")], T0 + 120, T0 + 400, nodes=["n1", "n2", "n3"])
    assert tl.nodes == ("n1", "n2", "n3", "n9")  # a node only a history names comes last
    assert [(j["id"], j["colour"]) for j in tl.jobs] == [("j2", PALETTE[0]), ("j1", PALETTE[1])]  # j3 never ran
    assert [(s.job, s.start, s.end) for s in tl.segments] == [("j1", T0 + 200, T0 + 275), ("j2", T0 + 150, T0 + 400)]
    assert [m.kind for m in tl.marks] == [MarkKind.RESUMED, MarkKind.TIME_SLICE, MarkKind.NOT_ACKNOWLEDGED]
    out = tl.as_json()
    assert out["marks"][0]["kind"] == "resumed" and "suspend acknowledged" in out["kinds"]
    assert list(out["segments"][0]["nodes"]) == ["n3", "n1"]


def test_a_jobs_timeline_shows_only_its_nodes_with_the_other_jobs_on_them():
    a = preempted_and_resumed()
    h = apply_start(record("h", "urgent", "bob", nodes=3), Start("h", ("n1", "n2", "n7")), T0 + 104, "n1", 1)
    assert h is not None
    tl = timeline([a, h], T0, T0 + 300, ["n1", "n2", "n3"], only=["n1", "n2", "n3"])
    assert {n for s in tl.segments for n in s.nodes} == {"n1", "n2", "n3"}  # n7 is not one of its nodes
    assert [s.nodes for s in tl.segments if s.job == "h"] == [("n1", "n2")]


def test_with_no_quota_the_table_says_there_is_no_limit_and_shows_the_use():
    running = apply_start(record(priority=30), Start("j1", ("a", "b")), T0 + 1, "a", 1)
    assert running is not None
    rows = views.quotas_vs_use(QuotaTable(), [running])
    assert rows == [{"user": "alice", "priority": "HIGH", "group": "*", "quota": "no limit", "used": 2}]
    assert "no limit" in views.quota_note(QuotaTable()) and "hfai quota set" in views.quota_note(QuotaTable())
    # A quota set for another level leaves this one unlimited, and the table says so.
    table = QuotaTable(entries=(QuotaEntry(user="alice", priority=20, group="*", nodes=4),))
    assert [(r["priority"], r["quota"], r["used"]) for r in views.quotas_vs_use(table, [running])] == [
        ("ABOVE_NORMAL", 4, 0), ("HIGH", "no limit", 2)]
    assert "1 quota(s) set" in views.quota_note(table)
    # A cluster whose levels above NORMAL need a quota: the HIGH job holding nodes without one is an
    # operator's, and the note gives the defaults as `hfai quota` does.
    assert [r["quota"] for r in views.quotas_vs_use(QuotaTable(), [running], needed_above=10)] == [views.CLOSED]
    note = views.quota_note(QuotaTable(), needed_above=10)
    assert "NORMAL and lower have no limit" in note and "HIGH" in note and "closed" in note
