"""`hfai exec` and `hfai shell` (agent/exec.py, cli/exec.py): a command in a running job's
processes, on the node of one rank, as the job's user, for its owner and operators alone; its
output streams back, its status is the CLI's, and nothing of it outlives the job.

The pure parts without NATS; then one local cluster for the module (a 2-node job of alice's)."""

from __future__ import annotations

import os
import subprocess
import sys

import pexpect
import psutil
import pytest
from spine_cluster import REPO, Cluster

from hfai.agent.exec import authorize, exit_status, session_members, window_open
from hfai.agent.plan import LocalRun, RunPhase
from hfai.auth.roles import Role, permissions
from hfai.cli.exec import ChunkOrder, target
from hfai.protocol import decode, encode, names
from hfai.protocol.errors import Conflict, Forbidden, InvalidRequest, NotFound
from hfai.protocol.types import (
    ChainState,
    DesiredRun,
    ExecExit,
    ExecInput,
    ExecOutput,
    ExecRequest,
    JobRecord,
    JobSpec,
    RunAssignment,
)


def _run(job: str = "j", user: str = "alice", rank: int = 1, run_id: int = 1,
         phase: RunPhase = RunPhase.ALIVE) -> LocalRun:
    ra = RunAssignment(job_id=job, run_id=run_id, name=job, user=user, group="default", priority=10, rank=rank,
                       world_size=2, master_addr="127.0.0.1", master_port=1, entrypoint=("true",), workdir="/",
                       desired=DesiredRun.RUN)
    return LocalRun(key=ra.key, assignment=ra, phase=phase)


# ------------------------------------------------------------------------------------ pure parts

def test_only_the_owner_or_an_operator_may_exec_next_to_the_rank_that_runs_here():
    local = {"j.1": _run(run_id=1, phase=RunPhase.EXITED, rank=0), "j.2": _run(run_id=2)}
    assert authorize("alice", False, "j", 1, local, "n").key == "j.2"  # the alive run, not the ended one
    assert authorize("root", True, "j", 1, local, "n").key == "j.2"
    with pytest.raises(Forbidden, match="it is alice's"):
        authorize("bob", False, "j", 1, local, "n")
    with pytest.raises(Forbidden):
        authorize("bob", False, "j", 0, local, "n")  # refused before learning where the ranks are
    with pytest.raises(NotFound, match="rank 0 of job j does not run on node n .rank 1 does"):
        authorize("alice", False, "j", 0, local, "n")
    with pytest.raises(NotFound, match="no running rank"):
        authorize("alice", False, "other", 1, local, "n")
    with pytest.raises(NotFound):
        authorize("alice", False, "j", 0, {"j.1": _run(phase=RunPhase.EXITED)}, "n")


def test_the_subjects_prove_the_caller_and_only_the_caller_reads_or_types_into_a_session():
    assert names.parse_agent_exec_subject(names.agent_exec_subject("node-1", "alice")) == ("node-1", "alice", False)
    op = names.agent_op_subject("node-1", "root", names.AGENT_OP_EXEC)
    assert names.parse_agent_exec_subject(op) == ("node-1", "root", True)
    for bad in (names.agent_op_subject("node-1", "root", names.AGENT_OP_SUSPEND), names.agent_logs_subject("n"),
                "hfai.agent.n.exec.alice.s.in"):
        with pytest.raises(InvalidRequest):
            names.parse_agent_exec_subject(bad)
    with pytest.raises(InvalidRequest):
        names.exec_stream_subject("n", "alice", "a.b", names.EXEC_OUT)  # a session id is one token
    alice, root, agent = permissions(Role.USER, "alice"), permissions(Role.OPERATOR, "root"), \
        permissions(Role.AGENT, "n")
    assert "hfai.agent.*.exec.alice" in alice.pub and "hfai.agent.*.exec.alice.*.in" in alice.pub
    assert alice.sub == ("_INBOX_u_alice.>", "hfai.agent.*.exec.alice.*.out")
    assert not any(".op." in p or p.endswith(".out") for p in alice.pub if p.startswith(names.AGENT_PREFIX))
    assert "hfai.agent.*.op.root.*" in root.pub  # its exec rides on the operator operations' subject
    assert "hfai.agent.n.exec.*.*.out" in agent.pub and "hfai.agent.n.>" in agent.sub
    # The operations' server hears its own verbs only: the exec request is not answered twice.
    assert names.agent_op_wildcard("n", names.AGENT_OP_SUSPEND) == "hfai.agent.n.op.*.suspend"


def test_the_messages_round_trip():
    for m in (ExecRequest(job_id="j", rank=1, session="s1", argv=("sh", "-c", "echo"), tty=True, rows=40, cols=120),
              ExecOutput(session="s1", seq=3, data=b"\x00\xff", stream=2), ExecExit(session="s1", seq=4, exit_code=7),
              ExecInput(session="s1", data=b"x", rows=1, cols=2, signal=2, acked=3, close=True)):
        assert decode(encode(m), type(m)) == m


def test_chunks_come_out_in_the_order_sent_and_a_gap_that_stays_is_counted_lost():
    order = ChunkOrder()
    assert order.add(1, "b") == [] and order.add(0, "a") == ["a", "b"] and order.acked == 1
    assert order.add(1, "dup") == []  # a chunk seen twice counts once
    assert order.finish(4) == [] and not order.complete
    assert order.add(3, "d") == []
    assert order.skip() == ["d"] and order.lost == 1 and order.complete  # chunk 2 never came
    many = ChunkOrder()
    out = [x for seq in range(1, 9) for x in many.add(seq, seq)]  # chunk 0 lost, 8 later ones held
    assert out == list(range(1, 9)) and many.lost == 1 and many.acked == 8
    assert ChunkOrder().finish(0) == [] and ChunkOrder(end=0).complete


def test_flow_control_exit_status_and_session_members():
    assert window_open(0, -1, 2) and window_open(1, -1, 2) and not window_open(2, -1, 2)
    assert window_open(2, 0, 2) and window_open(5, 4, 1) and not window_open(6, 4, 1)
    assert exit_status(7) == 7 and exit_status(-9) == 137 and exit_status(0) == 0
    procs = [(10, 10, 100.0), (11, 10, 105.0), (12, 12, 100.0), (13, 10, 50.0)]
    assert session_members(procs, 10, 100.0) == [10, 11]  # 13 is older than the session: a recycled sid


def test_the_node_of_a_rank_and_why_there_is_none():
    spec = JobSpec(name="train", entrypoint=("true",), workdir="/", nodes=2)
    running = JobRecord(id="j1", spec=spec, state=ChainState.RUNNING, submit_ts=0.0, nodes=("node-0", "node-1"))
    assert target(running, 1) == "node-1"
    with pytest.raises(InvalidRequest, match="rank 2 is out of range: job j1 has 2 rank"):
        target(running, 2)
    queued = JobRecord(id="j1", spec=spec, state=ChainState.QUEUED, submit_ts=0.0)
    with pytest.raises(Conflict, match="is queued, not running"):
        target(queued, 0)


# ------------------------------------------------------------------------------ a live cluster

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("exec")
    with Cluster(root / "cluster", nodes=2) as c:
        work = root / "work"
        work.mkdir()
        c.workdir = work  # type: ignore[attr-defined]
        done = c.submit(["true"], name="quick", user="alice", workdir=work)
        job = c.submit(["sleep", "600"], name="held", nodes=2, user="alice", workdir=work)
        c.job_id = c.wait_state(job.id, ChainState.RUNNING).id  # type: ignore[attr-defined]
        c.done_id = c.wait_state(done.id, ChainState.SUCCEEDED).id  # type: ignore[attr-defined]
        yield c


def _one_line(p: subprocess.CompletedProcess) -> str:
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    return lines[0]


@pytest.mark.slow
def test_exec_runs_in_the_ranks_environment_and_passes_the_status_through(cluster):
    jid = cluster.job_id
    one = cluster.cli("exec", jid, "-r", "1", "--", "sh", "-c", 'echo "rank=$RANK of $WORLD_SIZE in $PWD"',
                      user="alice")
    assert one.returncode == 0, one.stderr
    assert one.stdout == f"rank=1 of 2 in {cluster.workdir}\n"
    zero = cluster.cli("exec", jid, "--", "sh", "-c", "echo $RANK $HFAI_JOB_ID; echo oops >&2", user="alice")
    assert (zero.returncode, zero.stdout, zero.stderr) == (0, f"0 {jid}\n", "oops\n")
    assert cluster.cli("exec", jid, "--", "sh", "-c", "exit 7", user="alice").returncode == 7
    missing = cluster.cli("exec", jid, "--", "no-such-command-here", user="alice")
    assert missing.returncode == 127 and "cannot run 'no-such-command-here'" in missing.stderr
    # More output than one chunk, and than the window of unacknowledged chunks, arrives whole.
    big = cluster.cli("exec", jid, "--", sys.executable, "-c", "import sys; sys.stdout.write('x' * 9_000_000)",
                      user="alice")
    assert big.returncode == 0 and big.stdout == "x" * 9_000_000 and big.stderr == ""
    # An operator may run commands in anyone's job; the command is still the job's user's.
    op = cluster.cli("exec", jid, "-r", "1", "--", "sh", "-c", "echo $HFAI_USER", user="root")
    assert (op.returncode, op.stdout) == (0, "alice\n"), op.stderr


@pytest.mark.slow
def test_exec_forwards_stdin_when_asked(cluster, tmp_path):
    env = {**os.environ, **{k: v for k, v in cluster._cli_environ({"HFAI_USER": "alice"}).items() if v is not None}}
    cluster.creds("alice")
    p = subprocess.run([sys.executable, "-m", "hfai.cli.main", "exec", cluster.job_id, "-i", "--", "wc", "-c"],
                       input=b"hello world", capture_output=True, cwd=REPO, env=env, timeout=60)
    assert (p.returncode, p.stdout.strip()) == (0, b"11"), p.stderr


@pytest.mark.slow
def test_bad_requests_end_with_one_line(cluster):
    jid = cluster.job_id
    bob = cluster.cli("exec", jid, "--", "id", user="bob")
    assert "bob may not run commands in job" in _one_line(bob) and "alice's" in bob.stderr
    assert "no job with id or name 'nope'" in _one_line(cluster.cli("exec", "nope", "--", "true", user="alice"))
    assert "rank 5 is out of range" in _one_line(cluster.cli("exec", jid, "-r", "5", "--", "true", user="alice"))
    assert "is succeeded, not running" in _one_line(cluster.cli("exec", cluster.done_id, "--", "true", user="alice"))


@pytest.mark.slow
def test_shell_under_a_pty(cluster):
    cluster.creds("alice")
    env = {**os.environ, **{k: v for k, v in cluster._cli_environ({"HFAI_USER": "alice"}).items() if v is not None}}
    env["TERM"] = "dumb"
    child = pexpect.spawn(sys.executable, ["-m", "hfai.cli.main", "shell", cluster.job_id, "-r", "1", "--", "sh"],
                          env=env, cwd=str(REPO), timeout=30, dimensions=(30, 100))
    try:
        child.sendline("stty size; [ -t 0 ] && echo IS-A-TTY; echo RANK=$((RANK + 40))")
        child.expect("30 100")  # the terminal's size reached the remote one
        # A terminal (`tty`, which looks its name up in /dev/pts, says "not a tty" in the job's
        # container: the node's pseudo-terminal is not among the container's, docs/dev.md).
        child.expect("IS-A-TTY")
        child.expect("RANK=41")
        child.sendline("exit 3")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 3, child.before


@pytest.mark.slow
def test_nothing_of_an_exec_outlives_the_job(cluster):
    """Last in the module: it stops the job."""
    jid = cluster.job_id
    left = cluster.cli("exec", jid, "--", "sh", "-c", "sleep 1001 >/dev/null 2>&1 & echo $!", user="alice")
    assert left.returncode == 0, left.stderr
    # Its pid as the node sees it ($! is the pid in the job's container, a PID namespace of its own).
    leftover = next(p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "1001"])
    assert psutil.pid_exists(leftover)  # the session ended; what it left runs on with the job
    cluster.creds("alice")
    env = {**os.environ, **{k: v for k, v in cluster._cli_environ({"HFAI_USER": "alice"}).items() if v is not None}}
    live = subprocess.Popen([sys.executable, "-m", "hfai.cli.main", "exec", jid, "-r", "1", "--", "sleep", "1000"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cluster.wait(lambda: any(p.info["cmdline"] == ["sleep", "1000"] and p.pid != leftover
                                 for p in psutil.process_iter(["cmdline"])), 30, "the exec'd sleep to start")
        cluster.run(lambda api: api.stop(jid), user="alice")
        out, err = live.communicate(timeout=60)
    finally:
        live.kill()
    assert live.returncode == 137 and "its job's run on this node ended" in err, (live.returncode, out, err)
    cluster.wait(lambda: not psutil.pid_exists(leftover) or psutil.Process(leftover).status() == "zombie", 30,
                 "the process the first session left to be killed")
    assert not any(p.info["cmdline"] == ["sleep", "1000"] for p in psutil.process_iter(["cmdline"])
                   if p.status() != "zombie")
