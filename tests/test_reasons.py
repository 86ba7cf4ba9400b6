"""Typed reasons: every code renders, records carry them on the wire, an event with only words
renders them, and nothing in the controller reads its own words back."""

from __future__ import annotations

import inspect
import re
import tomllib
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from hfai.controller import transitions
from hfai.controller.policy import JobView, NodeView, PolicyConfig, Start, Wait, decide
from hfai.protocol import decode, encode, reasons
from hfai.protocol.reasons import RENDER, Reason, ReasonCode, describe, render
from hfai.protocol.types import ChainState, JobEvent, JobRecord, JobSpec, RunEvent, RunEventKind
from hfai.web.timeline import MarkKind, job_timeline

ROOT = Path(__file__).resolve().parent.parent
T0 = 1_750_000_000.0
SPEC = JobSpec(name="train", entrypoint=("x",), workdir="/", nodes=2, user="alice")

#: Parameters for each code's builder (:func:`build`), as its producer gives them.
SAMPLES: dict[ReasonCode, dict[str, object]] = {
    ReasonCode.TOO_BIG: {"need": 4, "group": "a", "usable": 3},
    ReasonCode.OVER_QUOTA: {"user": "u", "priority": "HIGH", "group": "a", "held": 2, "limit": 3, "need": 2},
    ReasonCode.QUOTA_CLOSED: {"user": "u", "priority": "HIGH", "group": "a", "closed_above": "NORMAL", "job": "j"},
    ReasonCode.NO_NODES: {"reserved": True},
    ReasonCode.NOT_PREEMPTIBLE: {"need": 3},
    ReasonCode.TIME_SLICE_WAIT: {"minutes": 7},
    ReasonCode.OWN_SESSION: {"job": "s", "name": "lab", "nodes": "n3", "priority": "NORMAL", "minutes": 9},
    ReasonCode.BEHIND_OWN_JOB: {},
    ReasonCode.RELEASING: {},
    ReasonCode.PREEMPTING: {},
    ReasonCode.PREEMPTED: {"job": "h", "priority": "HIGH", "victim_priority": "LOW", "size": 2},
    ReasonCode.TIME_SLICE: {"job": "k", "minutes": 31.0},
    ReasonCode.GROWS: {"held": 2, "size": 4},
    ReasonCode.UNACKED: {"job": "lazy", "since": T0, "stop_at": T0 + 60, "kill_at": T0 + 90, "late": True},
    ReasonCode.RESTRICTED: {"why": "storage over its limit"},
    ReasonCode.RESTRICTED_INTERRUPT: {"user": "u", "why": ""},
    ReasonCode.GPU_ERROR: {"node": "n1", "fault": "Xid 79 on GPU 3: fell off the bus"},
    ReasonCode.GPU_FAULT: {"gpu": 3, "xid": 79, "meaning": "fell off the bus", "kind": "hardware", "node": "n1"},
    ReasonCode.HELD: {"by": "ana", "job": "j"},
    ReasonCode.RETRY_BACKOFF: {"retried": 1, "retries": 3, "seconds": 25},
    ReasonCode.AFTER: {"job": "dep", "until": "succeed"},
    ReasonCode.ARRAY_LIMIT: {"array": "arr", "limit": 3, "running": 2, "ahead": 1},
    ReasonCode.TIME_LIMIT: {"ran": "1:00:00", "limit": "1:00:00"},
    ReasonCode.DEPENDENCY_FAILED: {"job": "dep", "state": "failed"},
    ReasonCode.STARTED: {"nodes": "n1, n2"},
    ReasonCode.RESUMED: {"nodes": "n2, n1"},
    ReasonCode.ACKNOWLEDGED: {"cause": "preempted by job h (priority HIGH > LOW)"},
    ReasonCode.NOT_ACKNOWLEDGED: {"cause": "requeued by bob"},
    ReasonCode.NODE_LOST: {"node": "n7"},
    ReasonCode.PLATFORM_STOPPED: {"rank": 3, "node": "n4", "message": "fenced", "requeued": True},
    ReasonCode.EXITED: {"rank": 2, "node": "n5", "code": -9, "retry": (2, 4)},
    ReasonCode.OUT_OF_MEMORY: {"rank": 0, "node": "n9", "limit": 96.0 * 2**30},  # written as "96 GiB"
    ReasonCode.HUNG: {"rank": 1, "node": "n3", "silent_s": 1800.0, "restart": (2, 3)},  # "30 min"
    ReasonCode.START_FAILED: {"node": "n6", "message": "no such file"},
    ReasonCode.FINISHED_SUSPENDING: {},
    ReasonCode.SUCCEEDED: {},
    ReasonCode.EXIT_CODES: {"codes": "n1=0, n2=137"},
    ReasonCode.SUBMITTED: {"by": "alice"},
    ReasonCode.QUEUED: {},
    ReasonCode.STOPPED_BY: {"by": "ana"},
    ReasonCode.REQUEUED_BY: {"by": "bob"},
    ReasonCode.RELEASED: {"by": "carol"},
    ReasonCode.TEXT: {"text": "las: class 1 yields to jobs with less attained service"},
    ReasonCode.DEV_IDLE: {"idle_s": 14400.0},  # written as "4 h"
    ReasonCode.DEV_NODE_LOST: {"node": "n8", "message": "fenced"},
}


def build(code: ReasonCode, /, **params: object) -> Reason:
    """A reason made by its code's builder, the function named as the code."""
    builder: Callable[..., Reason] = getattr(reasons, code.value)
    return builder(**params)


def test_every_code_has_words_and_renders_its_parameters():
    assert set(SAMPLES) == set(ReasonCode) == set(RENDER)
    texts = {}
    for code, params in SAMPLES.items():
        text = build(code, **params).text()
        assert text and "{" not in text and "\n" not in text, code
        for value in params.values():
            if isinstance(value, (str, int)) and not isinstance(value, bool) and value not in ("", 1):
                assert str(value) in text, (code, value)
        texts[code] = text
    assert len(set(texts.values())) == len(texts)  # no two codes say the same
    assert texts[ReasonCode.PREEMPTED] == "preempted by job h (priority HIGH > LOW): shrinks to 2 node(s)"
    assert texts[ReasonCode.UNACKED].endswith("killed at 15:08:10 UTC if still running")
    assert texts[ReasonCode.TIME_SLICE].endswith("after 31.0 min")
    assert reasons.no_nodes(reserved=False).text() == (
        "waiting for nodes: the group is full, and no running job may be preempted for it")
    # The words old clients and the tests of other areas read stay those of the text-only days.
    assert texts[ReasonCode.EXITED] == "rank 2 on n5 exited with code -9; retry 2 of 4"
    assert reasons.exited(rank=0, node="n1", code=1).text() == "rank 0 on n1 exited with code 1"
    assert texts[ReasonCode.PLATFORM_STOPPED] == "rank 3 on n4 stopped by the platform: fenced; requeued"
    assert reasons.platform_stopped(rank=0, node="n1", message="").text() == (
        "rank 0 on n1 stopped by the platform: interrupted")
    assert texts[ReasonCode.NODE_LOST] == "node n7 lost (no heartbeat); requeued"
    assert reasons.node_lost(node="n7", cause="stopped by ana").text() == "stopped by ana; node n7 lost"
    assert texts[ReasonCode.STOPPED_BY] == "stopped by ana" and texts[ReasonCode.REQUEUED_BY] == "requeued by bob"
    assert texts[ReasonCode.SUBMITTED] == "submitted by alice" and texts[ReasonCode.QUEUED] == "queued"


def test_a_code_or_parameters_this_side_does_not_know_render_as_the_records_words():
    assert render(Reason("a_newer_code", {"x": "1"}), "its words") == "its words"
    assert render(Reason(ReasonCode.TOO_BIG.value, {}), "its words") == "its words"  # parameters missing
    record = JobRecord(id="j", spec=SPEC, state=ChainState.QUEUED, submit_ts=T0, reason="its words",
                       why=Reason("a_newer_code"))
    assert describe(record) == "its words"


class _Reading(Mapping[str, str]):
    """A reason's parameters that note every one its words look up (``[]``, ``get``, ``in``)."""

    def __init__(self, params: Mapping[str, str]) -> None:
        self.params = params
        self.read: set[str] = set()

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return self.params[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)


def _sample(name: str, hint: object) -> object:
    """A value of a builder parameter's type (of ``X`` for ``X | None``)."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        [hint] = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)[0]
    if typing.get_origin(hint) is tuple:
        return tuple(_sample(name, a) for a in typing.get_args(hint))
    samples: dict[object, object] = {str: f"{name}-1", int: 2, float: 1800.0, bool: True}
    return samples[hint]


def test_each_builder_writes_exactly_the_parameters_its_words_read():
    """For every code, its builder with every parameter given: its words read each one written
    and none it does not write; with only the required ones: they need no other. (Some parameter
    may be read only along with an optional one: a GPU fault's kind, once a job's history names the
    node.)"""
    for code in ReasonCode:
        builder = getattr(reasons, code.value, None)
        assert callable(builder), f"no builder reasons.{code.value}()"
        hints = typing.get_type_hints(builder)
        assert hints.pop("return") is Reason, code
        signature = inspect.signature(builder)
        assert all(p.kind is p.KEYWORD_ONLY for p in signature.parameters.values()), code
        full = {name: _sample(name, hint) for name, hint in hints.items()}
        required = {k: v for k, v in full.items() if signature.parameters[k].default is inspect.Parameter.empty}
        for given in (full, required):
            why = builder(**given)
            assert why.code == code and all(type(v) is str for v in why.params.values()), (code, why)
            words = _Reading(why.params)
            RENDER[code](words)  # a KeyError here: its words need a parameter the builder did not write
            if given is full:
                assert set(why.params) <= words.read, (code, "written, never read:", set(why.params) - words.read)
                assert words.read <= set(why.params), (code, "read, never written:", words.read - set(why.params))


def test_every_reason_is_made_by_its_codes_builder():
    """Outside protocol/reasons.py no code makes a Reason itself (or through the untyped helper)."""
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    pattern = re.compile(r"\bReason\(|\b_reason\b.*\bReasonCode\b|reasons\._reason\b")
    files = {p for folder in folders for p in (ROOT / folder).rglob("*.py")} - {ROOT / "protocol" / "reasons.py"}
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in sorted(files)
            for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


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
    assert back == started and back.why == reasons.started(nodes="n1, n2")
    assert back.history[-1].why == back.why and describe(back.history[-1]) == "started on n1, n2"


def _running(on: tuple[str, ...] = ("n1", "n2"), retries: int = 0) -> JobRecord:
    queued = JobRecord(id="j", spec=transitions.replace(SPEC, nodes=len(on), retries=retries),
                       state=ChainState.QUEUED, submit_ts=T0, reason="queued")
    started = transitions.apply_start(queued, Start("j", on), T0 + 10, on[0], 1)
    assert started is not None
    return started


def _exit(job: JobRecord, node: str, code: int, **kw: object) -> JobRecord:
    after = transitions.apply_event(job, RunEvent(job_id=job.id, run_id=job.run_id, node=node,
                                                  event=RunEventKind.EXITED, ts=T0 + 50, exit_code=code, **kw), T0 + 50)
    assert after is not None
    return after


def _code(job: JobRecord) -> tuple[ChainState, str | None, dict[str, str]]:
    assert job.history[-1].why == job.why and job.history[-1].reason == job.reason  # the text is still written
    assert job.why is None or describe(job) == job.reason
    return job.state, job.why.code if job.why else None, dict(job.why.params) if job.why else {}


def test_every_transition_gives_its_code_and_still_writes_its_words():
    now = T0 + 60
    assert _code(_exit(_running(), "n2", 3)) == (ChainState.FAILED, "exited", {"rank": "1", "node": "n2", "code": "3"})
    retried = _exit(_running(retries=2), "n1", 1)
    assert _code(retried) == (ChainState.SUSPENDING, "exited",
                              {"rank": "0", "node": "n1", "code": "1", "retry": "1", "retries": "2"})
    assert _code(_exit(retried, "n2", -15)) == (ChainState.SUSPENDED, "not_acknowledged",
                                                {"cause": "rank 0 on n1 exited with code 1; retry 1 of 2"})
    at_once = _exit(_running(("n1",), retries=1), "n1", 1)
    assert _code(at_once)[:2] == (ChainState.SUSPENDED, "exited")
    fenced = _exit(_running(("n1",)), "n1", -9, platform_stopped=True, message="fenced")
    assert _code(fenced) == (ChainState.SUSPENDED, "platform_stopped",
                             {"rank": "0", "node": "n1", "message": "fenced", "requeued": "1"})
    assert _code(_exit(_running(), "n1", -9, platform_stopped=True))[:2] == (ChainState.SUSPENDING, "platform_stopped")
    done = _exit(_exit(_running(), "n1", 0), "n2", 0)
    assert _code(done) == (ChainState.SUCCEEDED, "succeeded", {})
    no_start = RunEvent(job_id="j", run_id=1, node="n2", event=RunEventKind.START_FAILED, ts=now, message="no file")
    failed = transitions.apply_event(_running(), no_start, now)
    assert failed is not None and _code(failed) == (ChainState.FAILED, "start_failed",
                                                    {"node": "n2", "message": "no file"})
    lost = transitions.apply_node_lost(_running(), "n2", now)
    assert lost is not None and _code(lost) == (ChainState.SUSPENDED, "node_lost", {"node": "n2"})
    stopping = transitions.apply_stop(_running(), now, "ana")
    assert stopping is not None and _code(stopping) == (ChainState.STOPPING, "stopped_by", {"by": "ana"})
    lost_stopping = transitions.apply_node_lost(stopping, "n1", now)
    assert lost_stopping is not None and _code(lost_stopping) == (
        ChainState.STOPPED, "node_lost", {"node": "n1", "cause": "stopped by ana"})
    stopped = _exit(_exit(stopping, "n1", 0), "n2", 0)
    assert _code(stopped) == (ChainState.STOPPED, "stopped_by", {"by": "ana"})
    queued = JobRecord(id="q", spec=SPEC, state=ChainState.QUEUED, submit_ts=T0, reason="queued")
    stopped_waiting = transitions.apply_stop(queued, now, "ana")
    assert stopped_waiting is not None and _code(stopped_waiting) == (ChainState.STOPPED, "stopped_by", {"by": "ana"})
    assert _code(transitions.apply_requeue(_running(), now, "bob")) == (ChainState.SUSPENDING, "requeued_by",
                                                                        {"by": "bob"})
    held = transitions.apply_hold(queued, "carol", True)
    assert held.why == reasons.held(by="carol", job="q")
    released = transitions.apply_hold(held, "carol", False)
    assert released.why == reasons.released(by="carol") and released.reason == "released by carol"


def test_a_requeue_at_once_marks_the_timeline_by_its_code_and_a_loss_while_suspending_marks_once():
    at_once = transitions.apply_node_lost(_running(), "n2", T0 + 60)
    assert at_once is not None
    assert [m.kind for m in job_timeline(at_once, T0 + 100)[1]] == [MarkKind.INTERRUPTED]
    asked = transitions.apply_requeue(_running(), T0 + 40, "bob")
    lost = transitions.apply_node_lost(asked, "n2", T0 + 60)
    assert lost is not None and lost.why is not None and lost.why.code == ReasonCode.NODE_LOST
    assert [m.kind for m in job_timeline(lost, T0 + 100)[1]] == [MarkKind.INTERRUPTED]


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
