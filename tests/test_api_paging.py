"""The API's reply pages: bounded in encoded bytes, never empty while items remain, each item
encoded once, and a node's heartbeat record encoded once while it stays the node's record."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from hfai.controller.api import ApiService, Caller
from hfai.controller.nodes import NodeTracker, jobs_on_nodes
from hfai.controller.paging import fill_page, paged_reply
from hfai.core.config import ControllerConfig
from hfai.protocol import codec, decode, encode
from hfai.protocol.types import (
    ChainState,
    GpuStat,
    JobList,
    JobRecord,
    JobSpec,
    ListRequest,
    NodeInfo,
    NodeRecord,
    NodesReply,
    NodesRequest,
    NodeState,
)

SPEC = JobSpec(name="j", entrypoint=("python", "t.py"), workdir="/w", nodes=2, user="alice")


def test_fill_page_fits_the_budget_and_always_progresses():
    items = [bytes(10)] * 10
    assert fill_page(items, 31) == (items[:3], True)
    assert fill_page(items, 30) == (items[:3], True)
    assert fill_page(items, 1) == (items[:1], True)  # one item even over the budget
    assert fill_page(items, 10**9) == (items, False)
    assert fill_page([], 100) == ([], False)


def test_fill_page_takes_no_item_past_the_first_that_does_not_fit():
    taken = []

    def items():
        for i in range(10):
            taken.append(i)
            yield bytes(10)
    assert len(fill_page(items(), 25)[0]) == 2 and taken == [0, 1, 2]


def test_paged_reply_is_the_reply_encode_writes_and_stays_in_budget():
    jobs = [JobRecord(id=f"j{i}", spec=SPEC, state=ChainState.QUEUED, submit_ts=float(i)) for i in range(10)]
    full = paged_reply(JobList, "jobs", (codec.pack(j) for j in jobs), 10**9)
    assert full.data == encode(JobList(jobs=tuple(jobs), more=False))
    # The page's array header is counted at its largest (5 bytes, 1 here).
    budget = len(encode(JobList(jobs=tuple(jobs[:3]), more=True))) + 4
    page = paged_reply(JobList, "jobs", (codec.pack(j) for j in jobs), budget)
    assert page.data == encode(JobList(jobs=tuple(jobs[:3]), more=True)) and len(page.data) <= budget
    assert len(paged_reply(JobList, "jobs", (codec.pack(j) for j in jobs), budget - 1).data) < len(page.data)
    alone = paged_reply(JobList, "jobs", (codec.pack(j) for j in jobs), 1)  # one job over the budget
    assert decode(alone.data, JobList) == JobList(jobs=(jobs[0],), more=True)


# ------------------------------------------------------------------------------ the nodes verb

GPU = GpuStat(index=0, name="H100", utilization=50.0, memory_used=1, memory_total=2, temperature=40.0, power_w=300.0)


def record(i: int, seq: int = 0) -> NodeRecord:
    return NodeRecord(name=f"n{i:02d}", group="default", address=f"10.0.0.{i}", ts=1.0, seq=seq,
                      gpus=tuple(GPU for _ in range(8)))


class Cluster:
    """An API service over heartbeat records held in memory, counting what the nodes verb does."""

    def __init__(self, nodes: int, reply_bytes: int):
        now = time.monotonic()
        self.cache = SimpleNamespace(values={r.name: r for r in map(record, range(nodes))}, revisions={},
                                     seen={f"n{i:02d}": now for i in range(nodes)})
        self.tracker = NodeTracker(self.cache, 30.0)  # type: ignore[arg-type]
        job = JobRecord(id="j1", spec=SPEC, state=ChainState.RUNNING, submit_ts=1.0, nodes=("n03", "n04"))
        self.jobs = SimpleNamespace(values={"j1": job})
        self.api = ApiService(None, self.jobs, self.tracker,  # type: ignore[arg-type]
                              config=ControllerConfig(api_reply_bytes=reply_bytes))
        self.pages: list[bytes] = []

    def walk(self) -> list[NodeInfo]:
        """Every node, page by page, as the client asks for them."""
        out: list[NodeInfo] = []
        req = NodesRequest()
        while True:
            data = encode(asyncio.run(self.api.nodes(Caller("alice"), req)))
            self.pages.append(data)
            page = decode(data, NodesReply)
            out.extend(page.nodes)
            if not (page.more and page.nodes):
                return out
            req = NodesRequest(after=page.nodes[-1].record.name)


@pytest.fixture
def counted(monkeypatch):
    """How many GPU readings the codec encoded (eight per heartbeat record)."""
    seen = {"gpus": 0}
    inner = codec._encoder(GpuStat)

    def counting(value):
        seen["gpus"] += 1
        return inner(value)
    monkeypatch.setitem(codec._ENCODERS, GpuStat, counting)
    return seen


def test_nodes_pages_hold_every_node_once_in_order_within_the_budget():
    one = len(encode(NodeInfo(record=record(0), state=NodeState.UP, age_s=1.0)))
    c = Cluster(20, reply_bytes=4 * one)
    infos = c.walk()
    assert [i.record for i in infos] == [record(i) for i in range(20)]
    assert len(c.pages) > 4 and all(len(p) <= 4 * one for p in c.pages)
    assert {i.record.name: i.jobs for i in infos if i.jobs} == {"n03": ("j1",), "n04": ("j1",)}
    assert all(i.state is NodeState.UP and 0 <= i.age_s < 30 for i in infos)


def test_a_heartbeat_record_is_encoded_once_while_it_is_current(counted):
    one = len(encode(NodeInfo(record=record(0), state=NodeState.UP, age_s=1.0)))
    c = Cluster(20, reply_bytes=4 * one)
    counted["gpus"] = 0
    c.walk()
    # Once per record over all the pages (sizing a page and then encoding it cost two, and the
    # one that did not fit on a page a third).
    assert counted["gpus"] == 20 * 8
    c.walk()
    assert counted["gpus"] == 20 * 8  # nothing changed: nothing encoded
    c.cache.values["n07"] = record(7, seq=1)  # a new heartbeat
    assert c.walk()[7].record.seq == 1
    assert counted["gpus"] == 21 * 8


def test_a_page_builds_the_infos_of_its_own_nodes_only(monkeypatch):
    one = len(encode(NodeInfo(record=record(0), state=NodeState.UP, age_s=1.0)))
    c = Cluster(20, reply_bytes=4 * one)
    looked_at = []
    state = NodeTracker.state

    def counting(self, name, now=None):
        looked_at.append(name)
        return state(self, name, now)
    monkeypatch.setattr(NodeTracker, "state", counting)
    c.walk()
    # Each node once, plus, per page, the first one that did not fit (not every node per page).
    assert len(looked_at) == 20 + len(c.pages) - 1
    assert len(set(looked_at)) == 20


def test_a_node_shows_the_jobs_of_every_state_that_holds_nodes_and_no_other():
    held = {s: jobs_on_nodes([JobRecord(id="j", spec=SPEC, state=s, submit_ts=1.0, nodes=("n0",))]) for s in ChainState}
    assert {s for s, on in held.items() if on == {"n0": ["j"]}} == {s for s in ChainState if s.holds_nodes}
    assert all(on in ({}, {"n0": ["j"]}) for on in held.values())


def test_forgotten_nodes_leave_the_kept_encodings():
    c = Cluster(5, reply_bytes=10**6)
    c.walk()
    for name in ("n00", "n01"):
        del c.cache.values[name]
    assert [i.record.name for i in c.walk()] == ["n02", "n03", "n04"]
    assert set(c.api._node_pages._packed) == {"n02", "n03", "n04"}


def test_pages_follow_the_names_in_the_records_whatever_their_keys():
    # The client asks for the page after the last record's name: ordered by key, a record named
    # before its key would bring the same page back for ever.
    one = len(encode(NodeInfo(record=record(0), state=NodeState.UP, age_s=1.0)))
    c = Cluster(12, reply_bytes=3 * one)
    c.cache.values["n11"] = record(0, seq=9)  # the key of n11 holds a record that says n00
    names = [i.record.name for i in c.walk()]
    assert names == sorted(names) and len(names) == 12 and len(c.pages) < 12


def test_job_list_pages_are_the_reply_encode_writes():
    c = Cluster(1, reply_bytes=10**6)
    jobs = {f"j{i}": JobRecord(id=f"j{i}", spec=SPEC, state=ChainState.QUEUED, submit_ts=float(i)) for i in range(5)}
    c.jobs.values = jobs
    reply = asyncio.run(c.api.list(Caller("alice"), ListRequest()))
    assert encode(reply) == encode(JobList(jobs=tuple(jobs.values()), more=False))
