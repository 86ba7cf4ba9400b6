"""Development sessions without a cluster: the scheduler's rule (a session is never time-sliced),
the submit checks (one node, [dev] max_per_user), JupyterLab's command line, what the proxy relays,
and that a job run as the agent's account does not carry the agent's credentials."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hfai.agent.devsession import base_url, jupyter_argv, notebooks_dir
from hfai.agent.identity import RUN_AS_AGENT, RUN_AS_SUBMITTER
from hfai.agent.jobenv import base_environment
from hfai.controller.policy import JobView, NodeView, PolicyConfig, Suspend, decide
from hfai.controller.validate import check_dev_limit, check_spec
from hfai.protocol.errors import Conflict, InvalidRequest
from hfai.protocol.types import JOB_DEV, ChainState, JobSpec, Priority
from hfai.web.devproxy import request_headers, response_headers, status_page, strip_cookie

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
