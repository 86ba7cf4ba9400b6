"""Typed reasons (protocol 1.3): every code renders, records carry them on the wire, records of
older controllers (text only) still decode and render, and nothing in the controller reads its
own words back."""

from __future__ import annotations

import re
from pathlib import Path

import msgpack

from hfai.controller import transitions
from hfai.controller.policy import JobView, NodeView, PolicyConfig, Start, Wait, decide
from hfai.protocol import decode, encode
from hfai.protocol.reasons import RENDER, Reason, ReasonCode, describe, reason, render
from hfai.protocol.types import ChainState, JobEvent, JobRecord, JobSpec
from hfai.web.timeline import MarkKind, job_timeline

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_750_000_000.0
SPEC = JobSpec(name="train", entrypoint=("x",), workdir="/", nodes=2, user="alice")

#: Parameters for each code, as its producer gives them.
SAMPLES: dict[ReasonCode, dict[str, object]] = {
    ReasonCode.TOO_BIG: {"need": 4, "group": "a", "usable": 3},
    ReasonCode.OVER_QUOTA: {"user": "u", "priority": "HIGH", "group": "a", "held": 2, "limit": 3, "need": 2},
    ReasonCode.QUOTA_CLOSED: {"user": "u", "priority": "HIGH", "group": "a", "closed_above": "NORMAL", "job": "j"},
    ReasonCode.NO_NODES: {"reserved": 1},
    ReasonCode.NOT_PREEMPTIBLE: {"need": 3},
    ReasonCode.TIME_SLICE_WAIT: {"minutes": 7},
    ReasonCode.BEHIND_OWN_JOB: {},
    ReasonCode.RELEASING: {},
    ReasonCode.PREEMPTING: {},
    ReasonCode.PREEMPTED: {"job": "h", "priority": "HIGH", "victim_priority": "LOW", "size": 2},
    ReasonCode.TIME_SLICE: {"job": "k", "minutes": "31.0"},
    ReasonCode.GROWS: {"held": 2, "size": 4},
    ReasonCode.UNACKED: {"job": "lazy", "since": T0, "stop_at": T0 + 60, "kill_at": T0 + 90, "late": 1},
    ReasonCode.RESTRICTED: {"why": "storage over its limit"},
    ReasonCode.RESTRICTED_INTERRUPT: {"user": "u", "why": ""},
    ReasonCode.GPU_ERROR: {"node": "n1"},
    ReasonCode.HELD: {"by": "ana", "job": "j"},
    ReasonCode.RETRY_BACKOFF: {"retried": 1, "retries": 3, "seconds": 25},
    ReasonCode.AFTER: {"job": "dep", "until": "succeed"},
    ReasonCode.ARRAY_LIMIT: {"array": "arr", "limit": 2},
    ReasonCode.TIME_LIMIT: {"ran": "1:00:00", "limit": "1:00:00"},
    ReasonCode.DEPENDENCY_FAILED: {"job": "dep", "state": "failed"},
    ReasonCode.STARTED: {"nodes": "n1, n2"},
    ReasonCode.RESUMED: {"nodes": "n2, n1"},
    ReasonCode.ACKNOWLEDGED: {"cause": "preempted by job h (priority HIGH > LOW)"},
    ReasonCode.NOT_ACKNOWLEDGED: {"cause": "requeued by bob"},
    ReasonCode.TEXT: {"text": "las: class 1 yields to jobs with less attained service"},
}


def test_every_code_has_words_and_renders_its_parameters():
    assert set(SAMPLES) == set(ReasonCode) == set(RENDER)
    texts = {}
    for code, params in SAMPLES.items():
        text = reason(code, **params).text()
        assert text and "{" not in text and "\n" not in text, code
        for value in params.values():
            if isinstance(value, (str, int)) and not isinstance(value, bool) and value not in ("", 1):
                assert str(value) in text, (code, value)
        texts[code] = text
    assert len(set(texts.values())) == len(texts)  # no two codes say the same
    assert texts[ReasonCode.PREEMPTED] == "preempted by job h (priority HIGH > LOW): shrinks to 2 node(s)"
    assert texts[ReasonCode.UNACKED].endswith("killed at 15:08:10 UTC if still running")
    assert reason(ReasonCode.NO_NODES, reserved="").text() == (
        "waiting for nodes: the group is full, and no running job may be preempted for it")


def test_a_code_or_parameters_this_side_does_not_know_render_as_the_records_words():
    assert render(Reason("a_newer_code", {"x": "1"}), "its words") == "its words"
    assert render(Reason(ReasonCode.TOO_BIG.value, {}), "its words") == "its words"  # parameters missing
    record = JobRecord(id="j", spec=SPEC, state=ChainState.QUEUED, submit_ts=T0, reason="its words",
                       why=Reason("a_newer_code"))
    assert describe(record) == "its words"


def test_the_policy_gives_typed_reasons_and_the_record_keeps_them_on_the_wire():
    running = JobView("r", "bob", 30, 1, 0.0, ChainState.RUNNING, held=("n0",), started_ts=T0)
    waiting = JobView("w", "alice", 30, 2, 1.0, ChainState.QUEUED)
    out = decide([running, waiting], [NodeView("n0")], T0 + 10, PolicyConfig())
    [wait] = [d for d in out if isinstance(d, Wait)]
    assert wait.why.code == ReasonCode.TOO_BIG and wait.why.params == {"need": "2", "group": "default", "usable": "1"}
    queued = JobRecord(id="w", spec=SPEC, state=ChainState.QUEUED, submit_ts=1.0, reason="queued")
    explained = transitions.apply_wait_reason(queued, wait.why)
    assert explained is not None and explained.reason == "needs 2 nodes, group 'default' has 1 usable"
    started = transitions.apply_start(explained, Start("w", ("n1", "n2")), T0, "n1", 1)
    assert started is not None
    back = decode(encode(started), JobRecord)
    assert back == started and back.why == reason(ReasonCode.STARTED, nodes="n1, n2")
    assert back.history[-1].why == back.why and describe(back.history[-1]) == "started on n1, n2"


def _old_record_bytes() -> bytes:
    """A record as a protocol 1.2 controller wrote it: no ``why`` anywhere, reasons in words."""
    body = {
        "id": "j1", "spec": {"name": "train", "entrypoint": ["x"], "workdir": "/", "nodes": 2, "user": "alice"},
        "state": "suspended", "submit_ts": T0, "run_id": 1, "reason": "preempted by job h (priority HIGH > LOW); "
        "acknowledged", "started_ts": T0 + 10, "last_nodes": ["n1", "n2"],
        "history": [
            {"ts": T0, "state": "queued", "reason": "submitted by alice"},
            {"ts": T0 + 10, "state": "running", "reason": "started on n1, n2"},
            {"ts": T0 + 100, "state": "suspending", "reason": "preempted by job h (priority HIGH > LOW)"},
            {"ts": T0 + 104, "state": "suspended", "reason": "preempted by job h (priority HIGH > LOW); acknowledged"},
        ],
    }
    return msgpack.packb({"k": "job_record", "v": [1, 2], "b": body}, use_bin_type=True)


def test_a_record_of_an_older_controller_decodes_renders_and_draws():
    old = decode(_old_record_bytes(), JobRecord)
    assert old.why is None and all(e.why is None for e in old.history)
    assert describe(old) == "preempted by job h (priority HIGH > LOW); acknowledged"
    segments, marks = job_timeline(old, now=T0 + 1000)
    assert [(s.nodes, s.start, s.end) for s in segments] == [(("n1", "n2"), T0 + 10, T0 + 104)]
    assert [m.kind for m in marks] == [MarkKind.PREEMPTED, MarkKind.ACKNOWLEDGED]
    # And a typed reason written over it replaces the words with its own.
    waiting = transitions.replace(old, state=ChainState.SUSPENDED)
    assert transitions.wait_reason_due(waiting, reason(ReasonCode.RELEASING), None, T0, 30.0)


def test_a_history_event_without_a_typed_reason_renders_its_words():
    assert describe(JobEvent(ts=T0, state=ChainState.QUEUED, reason="submitted by alice")) == "submitted by alice"


def test_the_controller_never_parses_a_reason_back_out_of_its_words():
    """What `git grep -n "re\\.\\(split\\|match\\|search\\).*reason"` checks, for every file of controller/."""
    pattern = re.compile(r"re\.(split|match|search).*reason")
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "controller").rglob("*.py"))
            for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_the_controller_does_not_import_the_simulator():
    pattern = re.compile(r"^\s*(from hfai\.sim\b|from hfai import sim\b|import hfai\.sim\b)", re.M)
    files = sorted((ROOT / "controller").rglob("*.py"))
    assert [str(p.relative_to(ROOT)) for p in files if pattern.search(p.read_text())] == []
