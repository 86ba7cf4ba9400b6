"""Development sessions without a cluster: the scheduler's rule (a session is never time-sliced),
the submit checks (one node, [dev] max_per_user), JupyterLab's command line, what the proxy relays,
that a job run as the agent's account does not carry the agent's credentials, how a session ends
that its user did not stop (idle: JupyterLab's own exit, status 75; its node lost: stopped, never
requeued), and the session's process telling an idle stop from the others with a real JupyterLab."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from waits import wait_for

from hfai.agent.devsession import base_url, jupyter_argv, notebooks_dir
from hfai.agent.identity import RUN_AS_AGENT, RUN_AS_SUBMITTER
from hfai.agent.jobenv import base_environment
from hfai.controller import transitions as tr
from hfai.controller.plan import PlanNode, PlanSettings, plan_once
from hfai.controller.policy import JobView, NodeView, PolicyConfig, Start, Suspend, decide
from hfai.controller.validate import check_dev_limit, check_spec
from hfai.protocol.errors import Conflict, InvalidRequest
from hfai.protocol.reasons import ReasonCode, describe
from hfai.protocol.types import DEV_IDLE_EXIT, JOB_DEV, ChainState, JobRecord, JobSpec, Priority, RunEvent, RunEventKind
from hfai.web.devproxy import ended_words, request_headers, response_headers, status_page, strip_cookie

NORMAL, HIGH = Priority.NORMAL.value, Priority.HIGH.value
NOW = 100_000.0


def _running(id: str, user: str, prio: int = NORMAL, dev: bool = False) -> JobView:
    return JobView(id, user, prio, 1, 0.0, ChainState.RUNNING, held=("n0",), started_ts=NOW - 99_999, dev=dev)


def _suspended(jobs) -> set[str]:
    waiting = JobView("w", "u", NORMAL, 1, 1.0, ChainState.QUEUED)
    return {d.job_id for d in decide([*jobs, waiting], [NodeView("n0", "default")], NOW, PolicyConfig(slice_s=1800.0))
            if isinstance(d, Suspend)}


def test_a_session_is_never_time_sliced_but_a_higher_priority_takes_its_node():
    assert _suspended([_running("batch", "v")]) == {"batch"}  # a batch job yields its slice
    assert _suspended([_running("lab", "v", dev=True)]) == set()  # a session keeps its node
    high = JobView("h", "u", HIGH, 1, 1.0, ChainState.QUEUED)
    out = decide([_running("lab", "v", dev=True), high], [NodeView("n0", "default")], NOW, PolicyConfig())
    assert {d.job_id for d in out if isinstance(d, Suspend)} == {"lab"}


def _dev(**kw) -> JobSpec:
    return JobSpec(name="lab", entrypoint=("python", "-m", "hfai.agent.devsession"), workdir="/tmp", kind=JOB_DEV,
                   user="alice", **kw)


def test_submit_checks_one_node_and_the_per_user_limit():
    assert check_spec(_dev()).kind == JOB_DEV
    with pytest.raises(InvalidRequest, match="runs on 1 node"):
        check_spec(_dev(nodes=2))
    with pytest.raises(InvalidRequest, match="unknown job kind"):
        check_spec(JobSpec(name="x", entrypoint=("true",), workdir="/tmp", kind="cron"))
    check_dev_limit(_dev(), live=0, max_per_user=1)
    with pytest.raises(Conflict, match="already has 1 development session .at most 1 at once.: stop one first"):
        check_dev_limit(_dev(), live=1, max_per_user=1)
    check_dev_limit(JobSpec(name="b", entrypoint=("true",), workdir="/tmp"), live=5, max_per_user=1)  # batch


def test_jupyterlab_command_line():
    argv = jupyter_argv("/py", "10.0.0.7", 8888, "abc123", Path("/nb/alice/notebooks"), idle_s=600)
    assert argv[:3] == ["/py", "-m", "jupyterlab"]
    assert "--ServerApp.ip=10.0.0.7" in argv and "--ServerApp.port=8888" in argv
    assert "--ServerApp.port_retries=0" in argv
    assert f"--ServerApp.base_url={base_url('abc123')}" in argv and base_url("abc123") == "/dev/abc123/"
    assert "--ServerApp.shutdown_no_activity_timeout=600" in argv
    assert "--MappingKernelManager.cull_idle_timeout=600" in argv
    assert not any("token" in a.lower() for a in argv)  # the token travels in the environment only
    assert not any("idle" in a for a in jupyter_argv("/py", "127.0.0.1", 1, "j", Path("/nb"), idle_s=0))
    assert notebooks_dir("/shared/jupyter", "alice", Path("/h")) == Path("/shared/jupyter/alice/notebooks")
    assert notebooks_dir("", "alice", Path("/h/.hfai")) == Path("/h/.hfai/jupyter/alice/notebooks")
    with pytest.raises(InvalidRequest):
        notebooks_dir("/r", "../bob", Path("/h"))


def test_the_proxy_relays_neither_the_sign_in_nor_hop_headers_and_adds_the_token():
    out = request_headers({"Cookie": "_xsrf=1; hfai_session=SECRET; other=2", "Host": "web", "Authorization": "x",
                           "Connection": "upgrade", "Accept": "*/*", "Origin": "http://web"}, "hfai_session", "T")
    assert out == {"Cookie": "_xsrf=1; other=2", "Accept": "*/*", "Authorization": "token T"}
    assert "Cookie" not in request_headers({"Cookie": "hfai_session=S"}, "hfai_session", "T")
    assert strip_cookie("hfai_session=S", "hfai_session") == ""
    assert response_headers({"Set-Cookie": "a=1", "Transfer-Encoding": "chunked", "Content-Type": "text/html"}) == [
        ("Set-Cookie", "a=1"), ("Content-Type", "text/html")]
    page = status_page("Session stopped", "lab <b> is stopped", refresh_s=2)
    assert "&lt;b&gt;" in page and "http-equiv='refresh' content='2'" in page


def test_a_job_run_as_the_agent_does_not_carry_the_agents_credentials(monkeypatch):
    monkeypatch.setenv("HFAI_NATS_CREDS", "/agents/node-0.creds")
    monkeypatch.setenv("HFAI_CONFIG", "/cluster/hfai.toml")
    env = base_environment(RUN_AS_AGENT)
    assert "HFAI_NATS_CREDS" not in env and env["HFAI_CONFIG"] == "/cluster/hfai.toml"
    assert not any(k.startswith("HFAI_") for k in base_environment(RUN_AS_SUBMITTER))
    assert os.environ["HFAI_NATS_CREDS"] == "/agents/node-0.creds"


def _session(kind: str = JOB_DEV) -> JobRecord:
    spec = JobSpec(name="lab", entrypoint=("python", "-m", "hfai.agent.devsession"), workdir="/tmp", kind=kind,
                   user="alice")
    job = JobRecord(id="s1", spec=spec, state=ChainState.QUEUED, submit_ts=1.0)
    return tr.apply_start(job, Start("s1", ("n0",)), 2.0, "10.0.0.1", 20000)


def _exit(code: int, *, stopped: bool = False, message: str = "") -> RunEvent:
    return RunEvent(event=RunEventKind.EXITED, node="n0", job_id="s1", run_id=1, ts=9.0, exit_code=code,
                    platform_stopped=stopped, message=message)


def test_an_idle_session_ends_stopped_for_idleness_not_succeeded():
    idle = tr.apply_event(_session(), _exit(DEV_IDLE_EXIT), 9.0, dev_idle_s=4 * 3600.0)
    assert idle.state is ChainState.STOPPED and idle.ended_ts == 9.0
    assert idle.why.code == ReasonCode.DEV_IDLE and idle.reason == "stopped: idle for 4 h" == describe(idle)
    assert idle.history[-1].why == idle.why  # the timeline and hfai status show it too
    assert tr.apply_event(_session(), _exit(DEV_IDLE_EXIT), 9.0, dev_idle_s=5400).reason == "stopped: idle for 1.5 h"
    # Any other end is what it always was: 0 succeeded (File > Shut Down), another status failed,
    assert tr.apply_event(_session(), _exit(0), 9.0).state is ChainState.SUCCEEDED
    assert tr.apply_event(_session(), _exit(1), 9.0).state is ChainState.FAILED
    # and 75 from a batch job is its own failure.
    batch = tr.apply_event(_session("batch"), _exit(DEV_IDLE_EXIT), 9.0, dev_idle_s=3600)
    assert batch.state is ChainState.FAILED
    # A user's stop that JupyterLab's idle exit raced still ends as the user's stop.
    stopping = tr.apply_stop(_session(), 5.0, "alice")
    assert tr.apply_event(stopping, _exit(DEV_IDLE_EXIT), 9.0, 3600).state is ChainState.STOPPED
    assert tr.apply_event(stopping, _exit(DEV_IDLE_EXIT), 9.0, 3600).why.code == ReasonCode.STOPPED_BY


def test_a_session_whose_node_is_lost_ends_with_the_reason_and_is_never_requeued():
    lost = tr.apply_node_lost(_session(), "n0", 9.0)
    assert lost.state is ChainState.STOPPED and lost.why.code == ReasonCode.DEV_NODE_LOST
    assert lost.reason == ("stopped: node n0 lost (no heartbeat); start a new session with hfai dev start "
                           "(the notebooks are kept)")
    assert tr.apply_node_lost(lost, "n0", 10.0) is None  # ended: nothing more
    batch = tr.apply_node_lost(_session("batch"), "n0", 9.0)
    assert batch.state is ChainState.SUSPENDED  # a batch job is requeued, as before
    # Its launcher fenced it (the agent went silent) or its end could not be recorded: the same.
    fenced = tr.apply_event(_session(), _exit(-1, stopped=True, message="fenced"), 9.0)
    assert fenced.state is ChainState.STOPPED and fenced.why.code == ReasonCode.DEV_NODE_LOST
    assert "the platform stopped it on n0: fenced" in fenced.reason
    # The session's page says so once, and what to do.
    assert ended_words(lost) == ("Development session lab (s1) is stopped: node n0 lost (no heartbeat); start a "
                                 "new session with hfai dev start (the notebooks are kept).")
    idle = tr.apply_event(_session(), _exit(DEV_IDLE_EXIT), 9.0, dev_idle_s=3600)
    assert ended_words(idle).startswith("Development session lab (s1) is stopped: idle for 1 h. Start a new one")
    failed = tr.apply_event(_session(), _exit(1), 9.0)
    assert "is failed: rank 0 on n0 exited with code 1." in ended_words(failed)
    # A session preempted by a higher priority goes back in line as documented, node lost or not.
    preempted = tr.apply_suspend(_session(), Suspend("s1", "preempted", for_job="h"), 5.0)
    assert tr.apply_node_lost(preempted, "n0", 9.0).state is ChainState.SUSPENDED


def test_the_leaders_plan_ends_a_session_on_a_dead_node_and_starts_nothing_for_it():
    session = _session()
    nodes = [PlanNode("n0", alive=False, schedulable=False), PlanNode("n1", address="10.0.0.2")]
    actions = plan_once([session], nodes, PlanSettings(policy=PolicyConfig()), 100.0)
    assert [type(a).__name__ for a in actions] == ["LoseNode"]  # a batch job gets a StartRun on n1 too
    after = actions[0].apply(session, 100.0)
    assert after.state is ChainState.STOPPED and after.why.code == ReasonCode.DEV_NODE_LOST


_LAB = """
import sys
from jupyter_server import serverapp
from tornado import ioloop

class Quick(ioloop.PeriodicCallback):  # jupyter_server checks for inactivity once a minute
    def __init__(self, cb, ms, *a, **k):
        super().__init__(cb, 200 if ms == 60000 else ms, *a, **k)

serverapp.ioloop.PeriodicCallback = Quick
from hfai.agent.devsession import run_lab
sys.exit(run_lab(["--no-browser", "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0", "--allow-root",
                  "--ServerApp.root_dir=" + sys.argv[1], "--ServerApp.token=t",
                  "--ServerApp.shutdown_no_activity_timeout=" + sys.argv[2]]))
"""


def test_the_sessions_process_exits_75_when_jupyterlab_stops_for_idleness_and_not_otherwise(tmp_path):
    pytest.importorskip("jupyterlab")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}

    def lab(idle: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", _LAB, str(tmp_path), str(idle)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    idle, busy = lab(1), lab(3600)  # together: a JupyterLab takes seconds to start
    out, _ = idle.communicate(timeout=120)
    assert idle.returncode == DEV_IDLE_EXIT, out[-2000:]
    assert "shutting down" in out
    wait_for(lambda: list((tmp_path / "rt").glob("jpserver-*.json")), 120, "the busy lab's server file", poll=0.2)
    assert busy.poll() is None  # not idle for an hour yet
    busy.send_signal(signal.SIGTERM)  # the agent's stop
    out, _ = busy.communicate(timeout=60)
    assert busy.returncode not in (DEV_IDLE_EXIT, None), out[-2000:]
