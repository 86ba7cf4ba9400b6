"""The agent's operator operations (agent/operations.py) without NATS: a suspend turns what the
agent wants into suspended runs, so its own plan raises the flags, signals and reports; only
operators may publish the operation's subject."""

from __future__ import annotations

import pytest

from hfai.agent.operations import Hold, held, unsettled
from hfai.agent.plan import Act, LocalRun, RunPhase, plan
from hfai.auth.roles import Role, permissions
from hfai.protocol import decode, encode, names
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import DesiredRun, NodeSuspendReply, NodeSuspendRequest, RunAssignment, RunEventKind


def _ra(job: str, desired: DesiredRun = DesiredRun.RUN) -> RunAssignment:
    return RunAssignment(job_id=job, run_id=1, name=job, user="u", group="default", priority=10, rank=0,
                         world_size=1, master_addr="127.0.0.1", master_port=1, entrypoint=("true",), workdir="/",
                         desired=desired, ack_window_s=60.0, kill_window_s=30.0)


def _acts(hold: Hold, desired: dict, local: dict, now: float) -> dict[str, list[Act]]:
    out: dict[str, list[Act]] = {}
    for a in plan(held(hold, desired, local), local, now):
        out.setdefault(a.key, []).append(a.act)
    return out


def test_a_hold_interrupts_every_live_run_through_the_agents_own_plan():
    ra = _ra("j")
    fresh = LocalRun(key="j.1", assignment=ra, phase=RunPhase.ALIVE, sent=frozenset({RunEventKind.STARTED}))
    flagged = LocalRun(key="j.1", assignment=ra, phase=RunPhase.ALIVE, suspend_ts=100.0, sent=fresh.sent)
    termed = LocalRun(key="j.1", assignment=ra, phase=RunPhase.ALIVE, suspend_ts=100.0, term_ts=130.0,
                      sent=fresh.sent)
    hold = Hold(ack_window_s=30.0, kill_window_s=10.0)
    assert _acts(hold, {"j.1": ra}, {"j.1": fresh}, 100.0) == {"j.1": [Act.RAISE_SUSPEND]}
    assert _acts(hold, {"j.1": ra}, {"j.1": flagged}, 110.0) == {}
    assert _acts(hold, {"j.1": ra}, {"j.1": flagged}, 131.0) == {"j.1": [Act.TERMINATE]}
    assert _acts(hold, {"j.1": ra}, {"j.1": termed}, 141.0) == {"j.1": [Act.KILL]}
    # Without windows of its own the hold keeps the run's (the leader's, from [controller]).
    assert _acts(Hold(), {"j.1": ra}, {"j.1": flagged}, 131.0) == {}
    assert _acts(Hold(), {"j.1": ra}, {"j.1": flagged}, 161.0) == {"j.1": [Act.TERMINATE]}


def test_a_hold_starts_nothing_leaves_stops_alone_and_suspends_runs_no_longer_wanted():
    hold = Hold(ack_window_s=0.0, kill_window_s=2.0)
    stray = LocalRun(key="old.1", assignment=_ra("old"), phase=RunPhase.ALIVE)
    stopping = _ra("s", DesiredRun.STOP)
    wanted = held(hold, {"new.1": _ra("new"), "s.1": stopping}, {"old.1": stray})
    assert wanted["new.1"].desired is DesiredRun.SUSPEND and wanted["s.1"] is stopping
    assert wanted["old.1"].desired is DesiredRun.SUSPEND and wanted["old.1"].ack_window_s == 0.0
    acts = _acts(hold, {"new.1": _ra("new")}, {"old.1": stray}, 5.0)
    assert acts["new.1"] == [Act.REPORT_NEVER_RAN]  # never started: said so, for the leader to requeue
    assert Act.RAISE_SUSPEND in acts["old.1"] and hold.runs == {"old.1"}


def test_a_node_is_settled_once_every_interrupted_run_reported_its_end():
    hold = Hold(runs={"a.1", "b.1", "c.1"})
    ended = LocalRun(key="a.1", assignment=_ra("a"), phase=RunPhase.EXITED, exit_code=0,
                     sent=frozenset({RunEventKind.STARTED, RunEventKind.EXITED}))
    unreported = LocalRun(key="b.1", assignment=_ra("b"), phase=RunPhase.EXITED, exit_code=0)
    assert unsettled(hold, {"a.1": ended, "b.1": unreported}) == ("b.1",)  # c.1 cleaned up: reported


def test_the_subject_names_node_operator_and_verb_and_only_operators_may_publish_it():
    subject = names.agent_op_subject("node-0", "root", names.AGENT_OP_SUSPEND)
    assert names.parse_agent_op_subject(subject) == ("node-0", "root", "suspend")
    with pytest.raises(InvalidRequest):
        names.parse_agent_op_subject(names.agent_logs_subject("node-0"))
    with pytest.raises(InvalidRequest):
        names.agent_op_subject("node.0", "root", names.AGENT_OP_SUSPEND)
    assert "hfai.agent.*.op.root.*" in permissions(Role.OPERATOR, "root").pub
    assert not any(f".{names.OPERATOR_TOKEN}." in p for p in permissions(Role.USER, "bob").pub)
    assert "hfai.agent.node-0.>" in permissions(Role.AGENT, "node-0").sub  # the agent hears them
    req = NodeSuspendRequest(ack_window_s=0.0, kill_window_s=2.0, wait_s=45.0)
    assert decode(encode(req), NodeSuspendRequest) == req and NodeSuspendRequest().ack_window_s is None
    reply = NodeSuspendReply(node="node-0", interrupted=("j.1",))
    assert decode(encode(reply), NodeSuspendReply) == reply
