"""Fuzz a live cluster: >= 10,000 malformed requests on every API verb and on an agent's log
service. Every one must get a reply that decodes to the verb's reply type or to an ErrorReply with
a typed code and a one-line message (never "internal": that is a handler crashing), the daemons
must stay up, and afterwards the cluster must still schedule and run a job to success.

Seeded: a failure repeats. Requests are pipelined (a batch in flight at once) to fit in about a
minute on two cores.
"""

from __future__ import annotations

import asyncio
import collections
import math
import random

import msgpack
import pytest
from fuzzing import mutate
from spine_cluster import JOBS, REPO, Cluster

from hfai.core import nats as _nats
from hfai.protocol import decode, encode, names
from hfai.protocol.errors import ProtocolError
from hfai.protocol.types import (
    ChainState,
    DrainRequest,
    ErrorReply,
    EstimateReply,
    EstimateRequest,
    HoldRequest,
    JobList,
    JobReply,
    JobRequest,
    JobSpec,
    ListRequest,
    LogChunk,
    LogRequest,
    NodesReply,
    NodesRequest,
    QuotaEntry,
    QuotaSetRequest,
    QuotasRequest,
    RequeueRequest,
    SettingsReply,
    StopRequest,
    SubmitRequest,
    UpdateRequest,
    UsageReply,
    UsageRequest,
)

pytestmark = pytest.mark.slow

USER = "fuzzer"
SEED = 20240607
API_REQUESTS = 10_500
AGENT_REQUESTS = 1_500
BATCH = 200
# The codes a refusal may carry; "internal" (a handler raised something unexpected) is a failure.
EXPECTED_CODES = {"protocol", "invalid", "not_found", "conflict", "forbidden", "unavailable", "illegal_transition"}

# Invalid in three independent ways, so that the mutations of one request (at most two that may drop
# a key; typed ones never produce the group "default") can never make it a job the cluster runs. The
# relative workdir is the last static check, so hostile names, sizes, commands and environments
# are all judged before it.
BAD_SPEC = JobSpec(name="fuzz", entrypoint=("python", "x.py"), workdir="relative", group="fuzz-nogroup",
                   env_name="fuzz-noenv", env={"A": "1"})

# verb -> (a well-formed request to mutate, the reply type besides ErrorReply)
VERBS: dict[str, tuple[object, type]] = {
    names.VERB_SUBMIT: (SubmitRequest(spec=BAD_SPEC), JobReply),
    names.VERB_LIST: (ListRequest(), JobList),
    names.VERB_STATUS: (JobRequest(job="nope"), JobReply),
    names.VERB_STOP: (StopRequest(job="nope"), JobReply),
    names.VERB_NODES: (NodesRequest(), NodesReply),
    names.VERB_QUOTA_SET: (QuotaSetRequest(entry=QuotaEntry(user=USER, priority=10, group="*", nodes=1)),
                           SettingsReply),
    names.VERB_SETTINGS: (QuotasRequest(), SettingsReply),
    names.VERB_DRAIN: (DrainRequest(node="nope"), SettingsReply),
}
if getattr(names, "VERB_LOGS", None):  # log requests relayed by the controller, where it offers them
    VERBS[names.VERB_LOGS] = (LogRequest(job_id="nope", rank=0), LogChunk)
if getattr(names, "VERB_USAGE", None):  # GPU-hours (controller/usage_recorder.py)
    VERBS[names.VERB_USAGE] = (UsageRequest(since_ts=0.0), UsageReply)
VERBS[names.VERB_HOLD] = (HoldRequest(job="nope"), JobReply)
VERBS[names.VERB_REQUEUE] = (RequeueRequest(job="nope"), JobReply)
VERBS[names.VERB_UPDATE] = (UpdateRequest(job="nope", priority=10), JobReply)
VERBS[names.VERB_ESTIMATE] = (EstimateRequest(default_run_s=60.0), EstimateReply)
assert set(VERBS) == set(names.VERBS), "a new API verb: add it to the fuzzer"

HOSTILE = [None, True, False, 0, -1, 1, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, 0.5, math.nan, math.inf, -math.inf,
           "", "\0", "a\0b", "\x1b[2J\x1b[H", "\r\n", "..", "../../etc/passwd", "/", "a/b", "*", ">", "a.b",
           "ü训练🚀", "\u202e", "x" * 300, b"", b"\xff\xfe", [], [""], ["\0", "a"], {}, {"": ""},
           {"A=B": "1"}, {"": "x"}, {"K": "\0"}, [[[[]]]], {"k": {"k": {"k": {}}}}, msgpack.ExtType(3, b"x")]

# Hostile values of the right wire type: these get past the codec and test the handlers.
TYPED = {
    str: ["", "\0", "a\0b", "\x1b[2J\x1b[H", "\r\n", "..", "../../etc/passwd", "/", "a/b", "*", ">", "a.b", "ü训练🚀",
          "\u202e", "x" * 300, "x" * 5000, "node-0", "root", "*", "A=B", " "],
    int: [0, -1, 1, 7, 2**31, 2**63 - 1, -(2**63), 2**64 - 1, 10**9, -10**9],
    float: [0.0, -1.0, 1e308, -1e308, 5e-324, 2.0**63, 1e18],
    bool: [True, False],
}


def mutate_typed(rng: random.Random, obj):
    """One random leaf of a wire tree replaced by a hostile value of the same type."""
    if isinstance(obj, dict) and obj:
        key = rng.choice(list(obj))
        if rng.random() < 0.2 and all(isinstance(v, str) for v in obj.values()):  # a str -> str map
            return {**obj, rng.choice(TYPED[str]): rng.choice(TYPED[str])}
        return {**obj, key: mutate_typed(rng, obj[key])}
    if isinstance(obj, list):
        if obj and rng.random() < 0.7:
            i = rng.randrange(len(obj))
            return obj[:i] + [mutate_typed(rng, obj[i])] + obj[i + 1:]
        return obj + [rng.choice(TYPED[str]) for _ in range(rng.randint(0, 3))]
    for tp in (bool, int, float, str):
        if type(obj) is tp:
            return rng.choice(TYPED[tp])
    return obj


# Specs each of which the controller accepted before submit-time validation (and the agent then
# failed to launch, or the policy choked on): refused now, on the real subject, with the right code.
ONCE_ACCEPTED = [
    dict(name="nul\0name"), dict(name="\x1b[2J\x1b[31mred"), dict(env={"A=B": "1"}), dict(env={"": "1"}),
    dict(env={"K": "v\0"}), dict(entrypoint=("python", "a\0b")), dict(nodes=-1), dict(nodes=10**9),
    dict(nodes=1, min_nodes=-3, max_nodes=0), dict(workdir="/tmp/a\0b"), dict(name="a/b"),
]


def payload(rng: random.Random, sample) -> bytes:
    """A malformed request built around ``sample`` (the verb's request)."""
    good = encode(sample)
    roll = rng.random()
    if roll < 0.35:  # well-typed, hostile values: past the codec, into the handler
        wire = msgpack.unpackb(good)
        for _ in range(rng.randint(1, 3)):
            wire = {**wire, "b": mutate_typed(rng, wire["b"])}
        return msgpack.packb(wire, use_bin_type=True)
    roll = rng.random()
    if roll < 0.45:  # a well-formed envelope with hostile fields
        wire = msgpack.unpackb(good)
        for _ in range(rng.randint(1, 2)):
            wire = mutate(rng, wire, HOSTILE, descend=0.85, replace=0.45)
        return msgpack.packb(wire, use_bin_type=True)
    if roll < 0.55:  # another kind of message, or an envelope that is not quite one
        other = rng.choice([v[0] for v in VERBS.values()] + [ErrorReply(code="x", message="y")])
        wire = msgpack.unpackb(encode(other))
        return msgpack.packb(rng.choice([wire, {**wire, "v": rng.choice(HOSTILE)}, {**wire, "k": rng.choice(HOSTILE)},
                                         {"k": wire["k"]}, [wire], wire["b"]]), use_bin_type=True)
    if roll < 0.7:  # truncated
        return good[: rng.randrange(len(good))]
    if roll < 0.8:  # a flipped byte
        i = rng.randrange(len(good))
        return good[:i] + bytes([rng.randrange(256)]) + good[i + 1:]
    if roll < 0.95:  # noise
        return rng.randbytes(rng.randrange(1, 96))
    # the rare big ones: deep nesting, an over-long string, a header that lies about its length
    return rng.choice([
        b"\x91" * rng.randint(1000, 5000) + b"\xc0",
        msgpack.packb({"k": sample.KIND, "v": [1, 1], "b": {"job": "x" * 140_000, "node": "y" * 140_000}}),
        b"\x83\xa1k\xdb\x7f\xff\xff\xff",
        msgpack.packb({"k": sample.KIND, "v": [1, 1], "b": [None] * 50_000}),
    ])


def check_reply(data: bytes, expect: type, counts: collections.Counter, where: str):
    try:
        reply = decode(data, (expect, ErrorReply))
    except ProtocolError as e:
        raise AssertionError(f"{where}: undecodable reply ({e})") from None
    if isinstance(reply, ErrorReply):
        assert reply.code in EXPECTED_CODES, f"{where}: {reply.code}: {reply.message}"
        assert reply.message and "\n" not in reply.message, f"{where}: {reply.message!r}"
        counts[f"{where}:{reply.code}"] += 1
    else:
        counts[f"{where}:{type(reply).__name__}"] += 1
    return reply


async def blast(send, requests: list[tuple[str, bytes, type, str]], counts: collections.Counter) -> None:
    """Send ``requests`` (subject, payload, expected type, label) BATCH at a time, all in flight."""
    for start in range(0, len(requests), BATCH):
        batch = requests[start:start + BATCH]
        replies = await asyncio.gather(*(send(subject, data) for subject, data, _, _ in batch), return_exceptions=True)
        for (subject, data, expect, label), reply in zip(batch, replies, strict=True):
            if isinstance(reply, BaseException):
                raise AssertionError(f"{label}: no reply on {subject} to {data[:60]!r}: {reply!r}")
            check_reply(reply, expect, counts, label)


def api_requests(rng: random.Random) -> list[tuple[str, bytes, type, str]]:
    out = []
    verbs = sorted(VERBS)
    for i in range(API_REQUESTS):
        verb = verbs[i % len(verbs)]
        sample, expect = VERBS[verb]
        out.append((names.api_subject(USER, verb), payload(rng, sample), expect, verb))
    rng.shuffle(out)
    return out


def agent_requests(rng: random.Random, node: str) -> list[tuple[str, bytes, type, str]]:
    subject = names.agent_logs_subject(node)
    samples = [LogRequest(job_id="nope", rank=0), LogRequest(job_id="j", rank=-1, offset=-5, max_bytes=-1),
               LogRequest(job_id="j", rank=2**63 - 1, offset=2**63 - 1, max_bytes=2**63 - 1)]
    out = [(subject, payload(rng, rng.choice(samples)), LogChunk, "agent-logs") for _ in range(AGENT_REQUESTS)]
    # Hostile but well-typed: paths that must not escape the agent's log directory.
    for job_id in ("..", "../..", "/etc/passwd", "a/b", ".", "x" * 65, "\0", "ü"):
        out.append((subject, encode(LogRequest(job_id=job_id, rank=0)), LogChunk, "agent-logs-path"))
    return out


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("fuzz"), nodes=1) as c:
        yield c


def test_garbage_on_every_subject_never_kills_a_service(cluster):
    rng = random.Random(SEED)
    node = cluster.local.node_name(0)
    counts: collections.Counter = collections.Counter()

    async def fuzz(api):
        await blast(api.raw_request, api_requests(rng), counts)
        # Users may not publish on agent subjects: reach the log service as the controller does.
        service = getattr(cluster, "service_creds", None)  # absent where the cluster has no auth
        nc = await _nats.connect(cluster.config, name="fuzz-service", reconnect=False,
                                 **({"creds": str(service())} if service else {}))
        try:
            async def send(subject: str, data: bytes) -> bytes:
                return (await nc.request(subject, data, timeout=cluster.config.nats.request_timeout_s)).data

            await blast(send, agent_requests(rng, node), counts)
        finally:
            await nc.close()
        # The specs the API took before it validated them are refused, and say why.
        for changes in ONCE_ACCEPTED:
            spec = JobSpec(**{"name": "once", "entrypoint": ("python", str(JOBS / "steps.py"), "1", "0"),
                              "workdir": str(REPO), **changes})
            reply = check_reply(await api.raw_request(names.api_subject(USER, names.VERB_SUBMIT),
                                                      encode(SubmitRequest(spec=spec))), JobReply, counts, "once")
            assert isinstance(reply, ErrorReply) and reply.code == "invalid", (changes, reply)

    cluster.run(fuzz, user=USER)
    total = sum(counts.values())
    assert total >= 10_000 + AGENT_REQUESTS, counts
    # The fuzz reached past the codec into every handler (some requests decoded and were judged).
    for verb in VERBS:
        assert any(k.startswith(f"{verb}:") and not k.endswith(":protocol") for k in counts), (verb, counts)
    assert not any(k.startswith(f"{names.VERB_SUBMIT}:JobReply") for k in counts), "a fuzzed spec became a job"
    assert counts["agent-logs-path:LogChunk"] == 0, "a job id that is no token was turned into a path"

    assert all(cluster.local.alive().values()), cluster.local.alive()
    job = cluster.submit(["python", str(JOBS / "steps.py"), "1", "0"], name="after-fuzz")
    done = cluster.wait_state(job.id, ChainState.SUCCEEDED, timeout=60)
    assert list(done.exits.values()) == [0]
    assert all(cluster.local.alive().values()), cluster.local.alive()
