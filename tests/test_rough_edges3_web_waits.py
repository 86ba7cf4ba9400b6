"""Issue 39 item 8: a LOW job preempted by its own user's development session said "waiting for its
time slice, next turn in ~23 min" (the slice was 90 s): true of another user's job it might slice
one day, silent about the session holding its node, whose end would start it. The policy's reason
names the session (and still the time slice's turn, when there is one)."""

from __future__ import annotations

from hfai.controller.policy import JobView, NodeView, PolicyConfig, Wait, decide
from hfai.controller.views import job_view
from hfai.protocol import reasons
from hfai.protocol.reasons import ReasonCode
from hfai.protocol.types import JOB_DEV, ChainState, JobRecord, JobSpec, Priority

LOW, NORMAL, HIGH = Priority.LOW.value, Priority.NORMAL.value, Priority.HIGH.value
NOW = 100_000.0
CFG = PolicyConfig(slice_s=90.0)


def job(id: str, user: str, prio: int, held: tuple[str, ...] = (), dev: bool = False, started: float = NOW - 60,
        **kw) -> JobView:
    state = ChainState.RUNNING if held else ChainState.QUEUED
    return JobView(id, user, prio, 1, 0.0, state, held=held, started_ts=started if held else 0.0, dev=dev,
                   name=id, **kw)


def wait_of(jobs, n: int = 2, config: PolicyConfig = CFG):
    [w] = [d for d in decide(jobs, [NodeView(f"n{i}") for i in range(n)], NOW, config) if isinstance(d, Wait)]
    return w.why


def test_a_job_behind_its_users_session_names_the_session():
    lab = job("lab", "alice", NORMAL, held=("n0",), dev=True)
    pretrain = job("pretrain", "alice", LOW, run_s=3000.0)  # preempted by the session; ran a while
    bobs = job("bobs", "bob", LOW, held=("n1",))  # another user's LOW job it may slice one day
    why = wait_of([lab, pretrain, bobs])
    assert why.code == ReasonCode.OWN_SESSION, why.text()
    assert why.params["job"] == "lab" and why.params["nodes"] == "n0" and why.params["priority"] == "NORMAL"
    text = why.text()
    assert text.startswith("waiting for nodes: its user's development session lab (job lab, NORMAL) holds n0")
    assert "hfai dev stop lab" in text and "time slice in ~" in text, text
    # Nobody else's job to slice: the session alone.
    why = wait_of([lab, pretrain], n=1)
    assert why.code == ReasonCode.OWN_SESSION and "time slice" not in why.text(), why.text()


def test_other_waits_are_as_they_were():
    # Another user's session: nothing of the job's own user to name.
    why = wait_of([job("lab", "bob", NORMAL, held=("n0",), dev=True), job("w", "alice", LOW)], n=1)
    assert why.code != ReasonCode.OWN_SESSION
    # Its user's session holds a node, but the job needs more than it would free.
    big = JobView("big", "alice", LOW, 3, 0.0, ChainState.QUEUED)
    why = wait_of([job("lab", "alice", NORMAL, held=("n0",), dev=True), job("h", "bob", HIGH, held=("n1",)), big])
    assert why.code != ReasonCode.OWN_SESSION
    # A session of a lower priority is preempted for the job rather than waited for.
    why = wait_of([job("lab", "alice", LOW, held=("n0",), dev=True), job("w", "alice", HIGH)], n=1)
    assert why.code == ReasonCode.PREEMPTING


def test_the_leader_gives_the_policy_the_sessions_name():
    spec = JobSpec(name="my-lab", entrypoint=("x",), workdir="/", user="alice", kind=JOB_DEV)
    view = job_view(JobRecord(id="j1", spec=spec, state=ChainState.RUNNING, submit_ts=0.0, nodes=("n0",)))
    assert view.dev and view.name == "my-lab"
    # The gist names the session: another session holding the node is news.
    a = reasons.own_session(job="a", name="x", nodes="n0", priority="NORMAL")
    b = reasons.own_session(job="b", name="y", nodes="n0", priority="NORMAL")
    assert a.gist() != b.gist()
