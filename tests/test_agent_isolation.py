"""The agent treats assignments, log requests and job-writable files as untrusted (no NATS: an
Agent built from a config, its store, and real files and processes)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from types import SimpleNamespace

import pytest
from waits import wait_for

from hfai.agent import safefs
from hfai.agent.identity import Account, job_identity
from hfai.agent.plan import Act, Action, RunPhase
from hfai.agent.service import Agent
from hfai.agent.trust import LOG_CHUNK_MAX, StartError, assignment_problem, run_problem
from hfai.core.config import AgentConfig, Config
from hfai.protocol import encode
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import DesiredRun, LogChunk, LogRequest, NodeAssignment, RunAssignment, RunEventKind


def _ra(job_id: str = "job1", user: str = "u", workdir: str = "/", **kw) -> RunAssignment:
    fields = dict(job_id=job_id, run_id=1, name="n", user=user, group="default", priority=10, rank=0,
                  world_size=1, master_addr="127.0.0.1", master_port=20000, entrypoint=("true",),
                  workdir=workdir, desired=DesiredRun.RUN)
    fields.update(kw)
    return RunAssignment(**fields)


def _entry(a: NodeAssignment) -> SimpleNamespace:
    return SimpleNamespace(value=encode(a), operation=None)


def _agent(tmp_path, **kw) -> Agent:
    cfg = AgentConfig(node="n0", state_dir=str(tmp_path / "state"), env_root=str(tmp_path / "envs"),
                      gpu_source="sim", **kw)
    return Agent(Config(agent=cfg))


def _recorder(agent: Agent) -> list:
    sent = []

    async def publish(ra, kind, **fields):
        sent.append((ra.key, kind, fields))
        return True

    agent.reports.publish = publish
    return sent


# ----------------------------------------------------------------------------- assignments

def test_the_attackers_assignment_is_refused_and_nothing_is_written_outside(tmp_path):
    """job_id "../../.." with a huge fence and `sh -c` as the command: refused as a whole, the
    fence stays, nothing runs, nothing appears outside the state directory."""
    agent = _agent(tmp_path)
    sent = _recorder(agent)
    pwned = tmp_path / "pwned"
    evil = _ra(job_id="../../..", entrypoint=("sh", "-c", f"id > {pwned}"), workdir=str(tmp_path))
    agent.assignment.on_assignment(_entry(NodeAssignment(node="n0", fence=10**15, runs=(_ra(), evil))))
    agent.assignment.on_snapshot_end()
    asyncio.run(agent.reconcile())
    time.sleep(0.3)
    assert agent.assignment.desired == {} and agent.fence.value == 0
    assert not (agent.store.root / "fence").exists()
    assert sent == [] and not pwned.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]
    # (containment: how this node contains its runs, written at start for `hfai local status`)
    assert sorted(p.name for p in agent.store.root.iterdir()) == ["containment", "control", "logs", "runs"]
    assert not any(agent.store.runs_dir.iterdir())
    with pytest.raises(InvalidRequest):  # the executor refuses such a key on its own as well
        agent.store.start(evil)
    assert not pwned.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["state"]


@pytest.mark.parametrize("bad", [
    dict(job_id="a/b"), dict(job_id=""), dict(job_id="x" * 65), dict(job_id="j\n1"), dict(user="../root"),
    dict(user="a b"), dict(group="g.1"), dict(env_name="../../bin"), dict(env_name="."), dict(run_id=-1),
    dict(rank=2, world_size=2), dict(rank=-1), dict(world_size=0), dict(master_port=70000),
    dict(suspend_count=-1),
])
def test_every_identifier_is_checked(bad):
    assert run_problem(_ra(**bad)) is not None
    assert assignment_problem(NodeAssignment(node="n0", fence=1, runs=(_ra(), _ra(**bad))), "n0") is not None


def test_an_assignment_for_another_node_is_refused_and_good_ones_are_taken(tmp_path):
    agent = _agent(tmp_path)
    agent.assignment.on_assignment(_entry(NodeAssignment(node="n1", fence=5, runs=(_ra(),))))
    assert agent.assignment.desired == {} and agent.fence.value == 0
    assert run_problem(_ra(env_name="torch-2_1")) is None
    agent.assignment.on_assignment(_entry(NodeAssignment(node="n0", fence=5, runs=(_ra(),))))
    assert list(agent.assignment.desired) == ["job1.1"] and agent.fence.value == 5


def test_an_unreadable_command_is_a_start_failure_not_a_crash(tmp_path):
    agent = _agent(tmp_path, run_as="agent")
    sent = _recorder(agent)
    for i, ra in enumerate([_ra(job_id="nul", entrypoint=("echo", "a\0b")), _ra(job_id="noargv", entrypoint=()),
                            _ra(job_id="badenv", env={"A=B": "1"}), _ra(job_id="nodir", workdir="/no/such/dir")]):
        asyncio.run(agent.reconciler.do(Action(Act.START, ra.key, ra), {}))
        assert sent[i][1] is RunEventKind.START_FAILED and sent[i][2]["message"]
    assert {r.phase for r in agent.store.snapshot().values()} == {RunPhase.EXITED}


# -------------------------------------------------------------------------------- run_as

AGENT_ROOT = Account("root", 0, 0, "/root", (0,))
ALICE = Account("alice", 1001, 1001, "/home/alice", (1001, 27))


def _lookup(name: str) -> Account | None:
    return {"alice": ALICE, "root": AGENT_ROOT}.get(name)


def test_a_root_agent_runs_jobs_as_their_submitter():
    who = job_identity("alice", "submitter", AGENT_ROOT, _lookup)
    assert who.switch and who.account == ALICE
    assert who.env == {"HOME": "/home/alice", "USER": "alice", "LOGNAME": "alice"}


def test_unknown_users_and_root_are_refused():
    with pytest.raises(StartError, match="no Unix account"):
        job_identity("mallory", "submitter", AGENT_ROOT, _lookup)
    with pytest.raises(StartError, match="never run as root"):
        job_identity("root", "submitter", AGENT_ROOT, _lookup)


def test_a_non_root_agent_runs_only_its_own_users_jobs():
    me = Account("bob", 1002, 1002, "/home/bob", (1002,))
    who = job_identity("bob", "submitter", me, _lookup)
    assert not who.switch and who.account == me and who.env["HOME"] == "/home/bob"
    with pytest.raises(StartError, match="not root"):
        job_identity("alice", "submitter", me, _lookup)


def test_run_as_agent_runs_everything_as_the_agent():
    who = job_identity("whoever", "agent", AGENT_ROOT, _lookup)
    assert not who.switch and who.account == AGENT_ROOT and who.env == {}
    with pytest.raises(InvalidRequest, match="run_as"):
        job_identity("alice", "root", AGENT_ROOT, _lookup)


def test_a_bad_run_as_stops_the_agent_with_one_line(tmp_path):
    with pytest.raises(InvalidRequest, match="run_as"):
        _agent(tmp_path, run_as="everyone")


def test_a_refused_user_is_reported_start_failed_with_the_reason(tmp_path):
    agent = _agent(tmp_path)  # run_as = "submitter"
    sent = _recorder(agent)
    ra = _ra(user="hfaitest-nosuch", entrypoint=("sh", "-c", f"touch {tmp_path / 'ran'}"))
    asyncio.run(agent.reconciler.do(Action(Act.START, ra.key, ra), {}))
    (key, kind, fields), = sent
    assert kind is RunEventKind.START_FAILED and "hfaitest-nosuch" in fields["message"]
    assert (agent.store.dir(key) / "start_error").read_text() == fields["message"]
    time.sleep(0.3)
    assert not (tmp_path / "ran").exists() and not (agent.store.dir(key) / "launcher_pid").exists()


# ------------------------------------------------------------------------------------ logs

def test_log_requests_are_checked_and_replies_fit_in_a_nats_message(tmp_path):
    agent = _agent(tmp_path)
    path = agent.store.log_path("job1", 0)
    path.parent.mkdir(parents=True)
    content = os.urandom(2 * 1024 * 1024)
    path.write_bytes(content)
    for bad in (LogRequest(job_id="../../etc", rank=0), LogRequest(job_id="job1", rank=-1),
                LogRequest(job_id="job1", rank=0, offset=-5)):
        with pytest.raises(InvalidRequest):
            agent.read_log(bad)
    got, offset = b"", 0
    while offset < len(content):
        chunk = agent.read_log(LogRequest(job_id="job1", rank=0, offset=offset, max_bytes=1 << 20))
        assert len(chunk.data) <= LOG_CHUNK_MAX and len(encode(chunk)) < 1024 * 1024 - 4096
        got += chunk.data
        offset += len(chunk.data)
    assert got == content
    assert agent.read_log(LogRequest(job_id="nope", rank=0)) == LogChunk(data=b"", offset=0, size=0, exists=False)


def test_the_log_service_never_follows_a_link_or_opens_a_fifo(tmp_path):
    agent = _agent(tmp_path)
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    d = agent.store.logs_dir / "job1"
    d.mkdir()
    (d / "rank0.log").symlink_to(secret)
    (d / "rank2.log").symlink_to(agent.store.root / "runs")  # inside the state dir, still a link
    os.mkfifo(d / "rank1.log")
    with pytest.raises(InvalidRequest, match="outside"):
        agent.read_log(LogRequest(job_id="job1", rank=0))
    with pytest.raises(OSError):
        agent.read_log(LogRequest(job_id="job1", rank=2))
    assert agent.read_log(LogRequest(job_id="job1", rank=1)).exists is False  # answered, not blocked


# ------------------------------------------------------------------------ the control dir

def test_files_a_job_plants_in_its_control_dir_are_not_followed(tmp_path):
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    target = tmp_path / "passwd"
    target.write_text("42\n")
    (ctl / "suspend").symlink_to(target)
    assert not safefs.create_flag(ctl, "suspend", b"now\n")
    assert target.read_text() == "42\n"
    assert safefs.lstat_mtime(ctl, "suspend") is not None  # the job's own flag counts as raised
    (ctl / "whole_life_state").symlink_to(target)
    assert safefs.read_small(ctl, "whole_life_state") is None
    (ctl / "whole_life_state").unlink()
    os.mkfifo(ctl / "whole_life_state")
    assert safefs.read_small(ctl, "whole_life_state") is None
    (ctl / "whole_life_state").unlink()
    (ctl / "whole_life_state").write_text("7\n")
    assert safefs.read_small(ctl, "whole_life_state") == b"7\n"
    assert safefs.create_flag(ctl, "flag", b"x") and (ctl / "flag").read_bytes() == b"x"


def test_whole_life_state_is_an_int64_or_nothing(tmp_path):
    agent = _agent(tmp_path, run_as="agent")
    ctl = agent.store.control_root / "job1.1"
    ctl.mkdir()
    for text, want in (("12\n", 12), ("9" * 40, None), ("x", None), ("", None)):
        (ctl / "whole_life_state").write_text(text)
        assert agent.store.whole_life_state("job1.1") == want


# ------------------------------------------------- issue 11 defect 3: stale fence at restart

def test_a_restarted_agent_seeing_only_a_stale_assignment_keeps_its_adopted_runs(tmp_path):
    first = _agent(tmp_path, run_as="agent")
    first.assignment.on_assignment(_entry(NodeAssignment(node="n0", fence=10, runs=(_ra(entrypoint=("sleep", "60")),))))
    launched = first.store.start(first.assignment.desired["job1.1"])
    try:
        wait_for(lambda: (first.store.dir("job1.1") / "child_pid").exists(), 10, "job1's child", poll=0.05)
        agent = _agent(tmp_path, run_as="agent")  # restarted; KV holds an older leader's entry
        sent = _recorder(agent)
        agent.assignment.on_assignment(_entry(NodeAssignment(node="n0", fence=9, runs=())))
        agent.assignment.on_snapshot_end()
        asyncio.run(agent.reconcile())
        run = agent.store.snapshot()["job1.1"]
        assert run.phase is RunPhase.ALIVE and run.term_ts is None
        assert [kind for _, kind, _ in sent] == [RunEventKind.STARTED]  # reported, not stopped
        agent.assignment.on_assignment(_entry(NodeAssignment(node="n0", fence=11, runs=())))
        asyncio.run(agent.reconcile())
        assert agent.store.snapshot()["job1.1"].term_ts is not None  # a current leader is obeyed
    finally:
        first.store.signal("job1.1", signal.SIGKILL)
        launched.wait(10)


def test_an_empty_kv_still_means_nothing_is_wanted(tmp_path):
    agent = _agent(tmp_path)
    agent.assignment.on_snapshot_end()
    assert agent.assignment.known and agent.assignment.desired == {}
