"""Multi-tenant trust on a live cluster with permissions on (as `hfai local up` runs it): who a
caller is comes from the credentials the NATS server checked, never from a name it claims."""

from __future__ import annotations

import asyncio
import os
import stat
import time

import nats
import nats.errors
import pytest
from spine_cluster import JOBS, Cluster
from waits import until

from hfai.api.client import ApiClient
from hfai.core import nats as _nats
from hfai.protocol import encode, names
from hfai.protocol.errors import ErrorSub, Forbidden, HfaiError
from hfai.protocol.types import ChainState, JobReply, RunEvent, RunEventKind, StopRequest

# Starts real clusters (nats-server, controllers, agents): excluded by `pytest -m "not slow"`.
pytestmark = pytest.mark.slow

STEPS = str(JOBS / "steps.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("auth"), nodes=2) as c:
        yield c


@pytest.fixture(scope="module")
def bobs_job(cluster):
    job = cluster.submit(["python", STEPS, "400", "0.1"], name="bobs", user="bob")
    cluster.wait_state(job.id, ChainState.RUNNING)
    return job


async def _refused_publish(url: str, creds, subject: str, payload: bytes = b"x") -> str:
    """Publish with ``creds`` and return the server's permissions error for it."""
    errors: list[str] = []

    async def on_error(e):
        errors.append(str(e))

    nc = await nats.connect(url, user_credentials=str(creds), error_cb=on_error, allow_reconnect=False)
    try:
        await nc.publish(subject, payload)
        await nc.flush()
        try:
            await until(lambda: errors, 2.5, "the server's permissions error")
        except AssertionError:
            pass  # none: the caller's check says what it expected
    finally:
        await nc.close()
    return " ".join(errors)


def test_credentials_files_are_private(cluster):
    creds = cluster.creds("alice")
    assert stat.S_IMODE(os.stat(creds).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(cluster.local.root / "auth").st_mode) == 0o700
    for seed in (cluster.local.root / "auth").glob("*.seed"):
        assert stat.S_IMODE(os.stat(seed).st_mode) == 0o600


def test_a_client_without_credentials_cannot_connect(cluster):
    async def go():
        with pytest.raises(nats.errors.Error, match="Authorization Violation") as refused:
            await nats.connect(cluster.config.nats.url, allow_reconnect=False, max_reconnect_attempts=0)
        # The one reading of nats-py's words (hfai.core.nats.server_refusal) knows the real server's.
        assert _nats.server_refusal(refused.value) is ErrorSub.CREDENTIALS_REFUSED
        with pytest.raises(Forbidden) as ours:
            await _nats.connect(cluster.config, name="anonymous", reconnect=False, creds="")
        assert ours.value.sub is ErrorSub.CREDENTIALS_REFUSED

    asyncio.run(go())
    env_home = cluster.local.root / "empty-home"
    r2 = cluster.cli_env({"HFAI_USER": "zed", "HFAI_NATS_CREDS_DIR": str(env_home)}, "ps")
    assert r2.returncode != 0 and "credentials" in r2.stderr and "Traceback" not in r2.stderr, r2.stderr


def test_hfai_user_is_not_an_identity(cluster, bobs_job):
    """alice with her own credentials and HFAI_USER=bob is still alice: she cannot stop bob's job
    nor list it as her own, and without bob's credentials file she cannot be bob at all."""
    alice = cluster.creds("alice")
    r = cluster.cli_env({"HFAI_USER": "bob", "HFAI_NATS_CREDS": str(alice)}, "stop", bobs_job.id)
    assert r.returncode != 0 and "belongs to bob" in r.stderr, r.stderr
    mine = cluster.cli_env({"HFAI_USER": "bob", "HFAI_NATS_CREDS": str(alice)}, "ps", "--mine")
    assert bobs_job.id not in mine.stdout
    assert cluster.job(bobs_job.id).state is ChainState.RUNNING


def test_the_server_refuses_a_publish_on_another_users_subject(cluster, bobs_job):
    alice = cluster.creds("alice")
    err = asyncio.run(_refused_publish(cluster.config.nats.url, alice, names.api_subject("bob", names.VERB_STOP),
                                       encode(StopRequest(job=bobs_job.id))))
    assert "permissions violation" in err.lower()
    assert _nats.denies(nats.errors.Error(err), names.api_subject("bob", names.VERB_STOP))

    async def through_the_client():
        async with ApiClient(cluster.config, user="alice") as api:
            with pytest.raises(Forbidden) as refused:
                await api.request(names.api_subject("bob", names.VERB_STOP), StopRequest(job=bobs_job.id), JobReply)
            assert refused.value.sub is ErrorSub.SUBJECT_DENIED  # the server's refusal, not the controller's

    asyncio.run(through_the_client())
    assert cluster.job(bobs_job.id).state is ChainState.RUNNING


def test_logs_only_for_the_owner_and_operators(cluster, bobs_job):
    cluster.wait(lambda: "step" in cluster.cli("logs", bobs_job.id, user="bob").stdout, 30, "bob's log")
    theirs = cluster.cli("logs", bobs_job.id, user="alice")
    assert theirs.returncode != 0 and "belongs to bob" in theirs.stderr and "step" not in theirs.stdout
    assert "step" in cluster.cli("logs", bobs_job.id, user="root").stdout  # an operator
    # A user cannot ask an agent directly: only controllers may publish on agent subjects.
    err = asyncio.run(_refused_publish(cluster.config.nats.url, cluster.creds("alice"),
                                       names.agent_logs_subject("node-0")))
    assert "permissions violation" in err.lower()


def test_only_operators_set_quotas_and_drain(cluster):
    with pytest.raises(Forbidden, match="only operators"):
        cluster.run(lambda api: api.set_quota("alice", 10, "*", 5), user="alice")
    with pytest.raises(Forbidden, match="only operators"):
        cluster.run(lambda api: api.drain("node-1"), user="alice")
    # Nor can she use the operator subject: the server refuses it.
    err = asyncio.run(_refused_publish(cluster.config.nats.url, cluster.creds("alice"),
                                       names.api_subject("alice", names.VERB_DRAIN, operator=True)))
    assert "permissions violation" in err.lower()
    assert cluster.run(lambda api: api.settings(), user="alice").drained.nodes == {}
    cluster.run(lambda api: api.set_quota("alice", 10, "*", 5), user="root")
    assert any(q.user == "alice" for q in cluster.run(lambda api: api.settings(), user="alice").quotas.entries)
    cluster.run(lambda api: api.set_quota("alice", 10, "*", -1), user="root")


def test_nobody_but_an_agent_reports_for_its_node(cluster, bobs_job):
    """Forged events: a user cannot publish on the events subjects, and an agent only on its own
    node's."""
    forged = encode(RunEvent(event=RunEventKind.EXITED, node="node-0", job_id=bobs_job.id, run_id=1, ts=time.time(),
                             exit_code=0))
    url = cluster.config.nats.url
    assert "permissions violation" in asyncio.run(
        _refused_publish(url, cluster.creds("alice"), names.event_subject("node-0"), forged)).lower()
    from hfai.auth.roles import Role

    agent1 = cluster.local.service_creds("node-1", Role.AGENT)
    assert "permissions violation" in asyncio.run(
        _refused_publish(url, agent1, names.event_subject("node-0"), forged)).lower()
    assert "permissions violation" in asyncio.run(
        _refused_publish(url, agent1, f"$KV.{names.BUCKET_ASSIGN}.node-1", b"{}")).lower()
    assert "permissions violation" in asyncio.run(
        _refused_publish(url, cluster.creds("alice"), f"$KV.{names.BUCKET_JOBS}.{bobs_job.id}", b"{}")).lower()
    assert cluster.job(bobs_job.id).state is ChainState.RUNNING


def test_a_revoked_user_is_refused_on_the_running_cluster(cluster):
    carol = cluster.creds("carol")
    assert cluster.cli("ps", user="carol").returncode == 0
    env = {"HFAI_ISSUER": str(cluster.local.root / "auth")}
    listed = cluster.cli_env(env, "admin", "user", "list")
    assert "carol" in listed.stdout and "operator" in listed.stdout  # root is one

    async def connected_then_revoked():
        async with ApiClient(cluster.config, user="carol") as api:
            await api.nodes()
            removed = await asyncio.to_thread(cluster.cli_env, env, "admin", "user", "remove", "carol")
            assert removed.returncode == 0, removed.stderr
            # The server closed her open connection: the request fails (closed, refused or unanswered).
            with pytest.raises((HfaiError, nats.errors.Error)):
                await api.nodes()

    asyncio.run(connected_then_revoked())
    after = cluster.cli_env({"HFAI_USER": "carol"}, "ps")  # (cli() would issue her new ones)
    assert after.returncode != 0 and "refused" in after.stderr and "Traceback" not in after.stderr, after.stderr
    assert carol.exists()  # the file is still there; the key in it is not valid any more
    assert "carol" not in cluster.cli_env(env, "admin", "user", "list").stdout


def test_admin_adds_a_user_who_can_then_submit(cluster):
    env = {"HFAI_ISSUER": str(cluster.local.root / "auth")}
    r = cluster.cli_env(env, "admin", "user", "add", "dave")
    assert r.returncode == 0, r.stderr
    again = cluster.cli_env(env, "admin", "user", "add", "dave")
    assert again.returncode != 0 and "already has credentials" in again.stderr
    ok = cluster.cli_env({"HFAI_USER": "dave"}, "submit", "--name", "d", "python", STEPS, "1", "0")
    assert ok.returncode == 0, ok.stderr
