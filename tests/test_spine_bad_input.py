"""Integration: garbage and invalid requests get clear errors; the controller keeps serving."""

from __future__ import annotations

import asyncio

import pytest
from spine_cluster import JOBS, REPO, Cluster

from hfai.api.client import ApiClient
from hfai.protocol import decode, encode, names
from hfai.protocol.types import ChainState, ErrorReply, JobSpec, ListRequest, NodesReply, NodesRequest, SubmitRequest

# Starts real clusters (nats-server, controllers, agents): excluded by `pytest -m "not slow"`.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("bad-input"), nodes=2) as c:
        yield c


def _raw(cluster, subject: str, payload: bytes):
    cluster.creds("mallory")

    async def go():
        async with ApiClient(cluster.config, user="mallory") as api:
            return decode(await api.raw_request(subject, payload))

    return asyncio.run(go())


@pytest.mark.parametrize("payload", [b"", b"\x00\xff garbage", b"\x93\x01\x02\x03", encode(ListRequest())[:-3]])
def test_malformed_bytes_get_a_protocol_error(cluster, payload):
    reply = _raw(cluster, names.api_subject("mallory", names.VERB_SUBMIT), payload)
    assert isinstance(reply, ErrorReply) and reply.code == "protocol"


def test_wrong_kind_and_unknown_verb_get_errors(cluster):
    wrong = _raw(cluster, names.api_subject("mallory", names.VERB_SUBMIT), encode(ListRequest()))
    assert isinstance(wrong, ErrorReply) and "expected SubmitRequest" in wrong.message
    unknown = _raw(cluster, "hfai.api.mallory.explode", encode(NodesRequest()))
    assert isinstance(unknown, ErrorReply) and unknown.code == "invalid"


def test_invalid_submissions_in_the_api(cluster):
    def submit(**kw):
        spec = JobSpec(**{"name": "x", "entrypoint": ("python", "x.py"), "workdir": str(REPO), **kw})
        return _raw(cluster, names.api_subject("mallory", names.VERB_SUBMIT), encode(SubmitRequest(spec=spec)))

    for kw, text in [({"nodes": 0}, "at least 1 node"), ({"nodes": 3}, "has 2"), ({"priority": 7}, "unknown priority"),
                     ({"env_name": "nope"}, "unknown environment"), ({"workdir": "rel"}, "absolute"),
                     ({"group": "gpu.big"}, "group")]:
        reply = submit(**kw)
        assert isinstance(reply, ErrorReply) and text in reply.message, (kw, reply)


@pytest.mark.parametrize("args, text", [
    (["submit", "-n", "0", "python", "examples/train.py"], "at least 1"),
    (["submit", "-n", "9", "python", "examples/train.py"], "has 2"),
    (["submit", "-p", "URGENTEST", "python", "examples/train.py"], "unknown priority"),
    (["python", "no_such_file.py", "--", "-n", "1"], "does not exist"),
    (["submit", "-i", "no-such-env", "python", "examples/train.py"], "unknown environment"),
    (["status", "no-such-job"], "no job"),
    (["stop", "no-such-job"], "no job"),
])
def test_cli_reports_user_mistakes_without_traceback(cluster, args, text):
    r = cluster.cli(*args)
    assert r.returncode != 0
    assert text in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_controller_still_serves_after_bad_input(cluster):
    _raw(cluster, names.api_subject("mallory", names.VERB_STATUS), b"\xc1")
    reply = _raw(cluster, names.api_subject("mallory", names.VERB_NODES), encode(NodesRequest()))
    assert isinstance(reply, NodesReply) and len(reply.nodes) == 2
    ok = cluster.cli("submit", "--name", "fine", "python", str(JOBS / "steps.py"), "1", "0")
    assert ok.returncode == 0, ok.stderr
    job_id = ok.stdout.split("(")[1].split(")")[0]
    assert list(cluster.wait_state(job_id, ChainState.SUCCEEDED).exits.values()) == [0]


def test_a_user_cannot_stop_another_users_job(cluster):
    job = cluster.submit(["python", str(JOBS / "steps.py"), "50", "0.1"], name="alices", user="alice")
    with pytest.raises(Exception, match="belongs to alice"):
        cluster.run(lambda api: api.stop(job.id), user="mallory")
    assert cluster.run(lambda api: api.stop(job.id), user="alice").state in (ChainState.STOPPED, ChainState.STOPPING)
