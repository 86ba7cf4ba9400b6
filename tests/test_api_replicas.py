"""A hung API replica does not fail calls (issue 26 §5): the client sends a repeatable request
again within the same deadline (hfai.api.client.try_plan), never a submit.

The fast tests serve the API queue group from this process on a real nats-server: one member
answers, one takes every request it is given and never answers (what a SIGSTOPped controller
does: NATS keeps handing it its share). tests/test_api_replicas_live.py freezes real controllers."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import pytest
from spine_cluster import nats_server

from hfai.api.client import ApiClient, try_plan
from hfai.core.config import Config, NatsConfig
from hfai.protocol import encode, names, verbs
from hfai.protocol.errors import ErrorSub, Unavailable
from hfai.protocol.types import JobList, JobRequest, JobSpec

USER = "tester"


@pytest.mark.parametrize(("deadline", "try_s", "copies", "plan"), [
    (5.0, 1.0, 16, ((0.0, 1), (1.0, 1), (2.0, 2), (3.0, 4), (4.0, 8))),
    (5.0, 1.25, 16, ((0.0, 1), (1.25, 1), (2.5, 2), (3.75, 4))),  # the deadline comes first
    (5.0, 1.0, 5, ((0.0, 1), (1.0, 1), (2.0, 2), (3.0, 1))),  # the cap comes first
    (5.0, 0.0, 16, ((0.0, 1),)),  # retries off
    (5.0, 1.0, 1, ((0.0, 1),)),
    (1.0, 1.0, 16, ((0.0, 1),)),  # a try as long as the deadline: no time for another
])
def test_try_plan(deadline, try_s, copies, plan):
    assert try_plan(deadline, try_s, copies) == plan


def test_only_requests_safe_to_repeat_are_repeated():
    assert not verbs.SUBMIT.repeatable and not verbs.REQUEUE.repeatable and not verbs.REQUEUE.movable
    assert verbs.SUBMIT.movable  # through another server only, named by its request_id
    assert all(v.repeatable for v in (verbs.LIST, verbs.STATUS, verbs.NODES, verbs.STOP))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with nats_server(tmp_path_factory.mktemp("nats")) as url:
        yield url


class Replicas:
    """Two members of the API queue group: ``live`` answers every list with an empty page,
    ``hung`` never answers. Counts what each was handed, per verb."""

    def __init__(self, url: str):
        self.url = url
        self.seen: dict[str, dict[str, int]] = {"live": {}, "hung": {}}
        self._conns: list[nats.aio.client.Client] = []

    async def __aenter__(self) -> Replicas:
        for who in ("live", "hung"):
            nc = await nats.connect(self.url)
            self._conns.append(nc)

            async def handle(msg, who=who):
                verb = msg.subject.rsplit(".", 1)[-1]
                self.seen[who][verb] = self.seen[who].get(verb, 0) + 1
                if who == "live" and verb == names.VERB_LIST:
                    await msg.respond(encode(JobList(jobs=(), more=False)))

            await nc.subscribe(names.API_WILDCARD, queue=names.API_QUEUE, cb=handle)
            await nc.flush()
        return self

    async def __aexit__(self, *exc) -> None:
        for nc in self._conns:
            await nc.close()

    def total(self, verb: str) -> int:
        return sum(seen.get(verb, 0) for seen in self.seen.values())


def _config(url: str, tmp_path: Path, try_s: float, deadline_s: float = 2.0) -> Config:
    # No credentials (this server has no auth); a short deadline keeps the test to seconds.
    return Config(nats=NatsConfig(url=url, creds_dir=str(tmp_path), request_timeout_s=deadline_s,
                                  request_try_s=try_s))


async def _lists(config: Config, calls: int) -> int:
    """How many of ``calls`` lists failed."""
    failed = 0
    async with ApiClient(config, user=USER) as api:
        for _ in range(calls):
            try:
                await api.list()
            except Unavailable:
                failed += 1
    return failed


async def test_a_hung_member_of_the_queue_group_costs_no_call(server, tmp_path):
    async with Replicas(server) as replicas:
        failed = await _lists(_config(server, tmp_path, try_s=0.1), 20)
    assert failed == 0
    # The hung member really was handed requests (else this test shows nothing).
    assert replicas.seen["hung"].get(names.VERB_LIST, 0) > 0, replicas.seen
    assert replicas.seen["live"][names.VERB_LIST] >= 20


async def test_with_one_try_the_hung_member_fails_its_share(server, tmp_path):
    """The behaviour before the fix, kept as a control: one try fails whenever NATS picks the
    hung member (all 8 lists succeeding by chance: 1 in 256)."""
    async with Replicas(server) as replicas:
        failed = await _lists(_config(server, tmp_path, try_s=0.0, deadline_s=0.3), 8)
    assert failed == replicas.seen["hung"][names.VERB_LIST] > 0


async def test_a_submit_is_sent_once_however_long_it_waits(server, tmp_path):
    async with Replicas(server) as replicas:
        async with ApiClient(_config(server, tmp_path, try_s=0.2), user=USER) as api:
            with pytest.raises(Unavailable, match="no answer within 2s"):
                await api.submit(JobSpec(name="once", entrypoint=("true",), workdir=str(tmp_path)))
        await asyncio.sleep(0.1)  # anything sent has reached a member by now
    assert replicas.total(names.VERB_SUBMIT) == 1


async def test_a_request_nobody_answers_fails_at_the_deadline_saying_how_often_it_asked(server, tmp_path):
    async with Replicas(server) as replicas:
        async with ApiClient(_config(server, tmp_path, try_s=0.5), user=USER) as api:
            with pytest.raises(Unavailable, match=r"no answer within 2s .*status \(asked 8 times\)"):
                await api.status("nobody-answers-status")
    assert replicas.total(names.VERB_STATUS) == 8  # 1, 1, 2 and 4 copies at 0, 0.5, 1 and 1.5 s


async def test_a_calls_own_timeout_is_its_alone(server, tmp_path):
    """Two calls at once on one client: the one given ``timeout=`` waits that long, the other the
    configured time (no twin of the client with another config: storage's commit relies on it)."""
    async with Replicas(server) as replicas:
        async with ApiClient(_config(server, tmp_path, try_s=0.1, deadline_s=2.0), user=USER) as api:
            short, usual = await asyncio.gather(
                api.call(verbs.STATUS, JobRequest(job="short"), timeout=0.4),
                api.call(verbs.STATUS, JobRequest(job="usual")), return_exceptions=True)
        await asyncio.sleep(0.1)  # anything sent has reached a member by now
    assert isinstance(short, Unavailable) and "no answer within 0.4s" in str(short), short
    assert isinstance(usual, Unavailable) and "no answer within 2s" in str(usual), usual
    assert short.sub is usual.sub is ErrorSub.NO_ANSWER
    copies = _config(server, tmp_path, 0.1).nats.request_copies
    planned = try_plan(0.4, 0.1, copies) + try_plan(2.0, 0.1, copies)
    assert replicas.total(names.VERB_STATUS) == sum(n for _, n in planned)


async def test_no_controller_at_all_is_its_own_case(server, tmp_path):
    async with ApiClient(_config(server, tmp_path, try_s=0.1), user=USER) as api:
        with pytest.raises(Unavailable, match="no controller") as e:
            await api.call(verbs.STATUS, JobRequest(job="nobody"))
    assert e.value.sub is ErrorSub.NO_RESPONDERS
