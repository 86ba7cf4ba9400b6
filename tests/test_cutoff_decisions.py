"""The pure decisions behind leaving a NATS server cut off from its cluster (hfai.core.cutoff), and the
store probe's judgement of a probe that found no JetStream to ask (issue 38 §7). The live
partition is tests/test_cutoff_partition.py."""

from __future__ import annotations

import random
from types import SimpleNamespace
from urllib.parse import urlparse

import pytest
from nats.aio.client import Server

from hfai.controller.store_health import StoreWatch
from hfai.core.cutoff import CutoffWatch, ServerChooser, Verdict, may_publish, quorum_failure


def test_a_server_is_cut_off_only_after_a_run_of_unanswered_checks_lasting_the_set_time():
    w = CutoffWatch(after_s=4.0)
    assert w.observe(True, 0.0) is Verdict.ANSWERS
    assert w.observe(False, 1.0) is Verdict.DOUBT
    assert w.observe(False, 4.9) is Verdict.DOUBT  # 3.9 s without an answer
    assert w.observe(True, 5.0) is Verdict.ANSWERS  # one answer clears the run
    assert w.observe(False, 6.0) is Verdict.DOUBT
    assert w.observe(False, 10.0) is Verdict.CUT_OFF
    # One unanswered check, however long it took, is not a run (a slow answer is no partition).
    lone = CutoffWatch(after_s=4.0)
    assert lone.observe(False, 100.0) is Verdict.DOUBT
    w.reset()
    assert w.observe(False, 11.0) is Verdict.DOUBT  # a new connection is judged afresh


def _servers(*netlocs: str, reconnects: dict[str, int] | None = None) -> list[Server]:
    return [Server(uri=urlparse(f"nats://{n}"), reconnects=(reconnects or {}).get(n, 0)) for n in netlocs]


def test_a_reconnect_goes_elsewhere_than_the_server_left_as_cut_off_until_the_avoidance_ends():
    now = [0.0]
    waits = iter([0.5, 1.0, 2.0])
    chooser = ServerChooser(avoid_s=30.0, wait=lambda: next(waits), clock=lambda: now[0], rng=random.Random(1))
    pool = _servers("a:1", "b:1", "c:1")
    chooser.avoid("a:1")
    for _ in range(20):
        chooser.connected()
        pick, delay = chooser(pool, {})
        assert pick.uri.netloc != "a:1" and delay == 0.0  # the first try after a lost connection: at once
    # Tries that fail wait the caller's backoff, and go to the servers that failed least.
    pick, delay = chooser(_servers("a:1", "b:1", "c:1", reconnects={"b:1": 1}), {})
    assert (pick.uri.netloc, delay) == ("c:1", 0.5)
    pick, delay = chooser(_servers("a:1", "b:1", "c:1", reconnects={"b:1": 1, "c:1": 1}), {})
    assert pick.uri.netloc in {"b:1", "c:1"} and delay == 1.0
    # Every other server failing more: the avoided one is still not tried before them...
    pick, _ = chooser(_servers("a:1", "b:1", "c:1", reconnects={"b:1": 3, "c:1": 3}), {})
    assert pick.uri.netloc != "a:1"
    # ...until its avoidance ends.
    now[0] = 31.0
    chooser.connected()
    pick, _ = chooser(_servers("a:1", "b:1", "c:1", reconnects={"b:1": 3, "c:1": 3}), {})
    assert pick.uri.netloc == "a:1"


def test_a_reconnect_prefers_the_servers_it_was_given_to_those_the_cluster_told_of():
    """A controller given servers b and c that leaves b goes to c, not to a, which it only heard
    of from the cluster: a server cut off from its cluster is still gossiped about, and a move into
    it took the controller's API away from every other server (tests/test_cutoff_cli.py, under
    load). One that failed more than a gossiped one is not preferred for ever."""
    chooser = ServerChooser(avoid_s=30.0, wait=lambda: 1.0, rng=random.Random(2))
    pool = _servers("b:1", "c:1", "a:1")
    pool[2].discovered = True
    chooser.avoid("b:1")
    for _ in range(20):
        chooser.connected()
        pick, _ = chooser(pool, {})
        assert pick.uri.netloc == "c:1"
    pool[1].reconnects = 2
    pick, _ = chooser(pool, {})
    assert pick.uri.netloc == "a:1"


def test_the_only_server_is_chosen_even_when_avoided():
    chooser = ServerChooser(avoid_s=30.0, wait=lambda: 1.0)
    chooser.avoid("a:1")
    pick, delay = chooser(_servers("a:1"), {})
    assert pick.uri.netloc == "a:1" and delay == 0.0
    assert chooser([], {}) == (None, 0.0)


@pytest.mark.parametrize("subject, allowed, ok", [
    ("$JS.API.STREAM.INFO.KV_hfai_nodes", [">"], True),
    ("$JS.API.STREAM.INFO.KV_hfai_nodes", ["$JS.API.STREAM.INFO.KV_hfai_nodes"], True),
    ("$JS.API.STREAM.INFO.KV_hfai_nodes", ["$JS.API.STREAM.INFO.*"], True),
    ("$JS.API.STREAM.INFO.KV_hfai_nodes", ["$JS.API.>"], True),
    ("$JS.API.STREAM.INFO.KV_hfai_nodes", ["$JS.API.INFO", "$JS.API.STREAM.INFO.HFAI_TELEMETRY"], False),
    ("$JS.API.STREAM.INFO.KV_hfai_nodes", ["$JS.API.STREAM.INFO.KV_hfai_nodes.>"], False),
    ("$JS.API.STREAM.INFO", ["$JS.API.STREAM.INFO.>"], False),
    ("$JS.API.STREAM.INFO.KV_hfai_nodes", [], False),
])
def test_whether_a_role_may_ask_for_a_stream_s_info(subject, allowed, ok):
    assert may_publish(subject, allowed) is ok


def _info(leader: str | None, *actives_s: float | None) -> SimpleNamespace:
    peers = [SimpleNamespace(name=f"p{i}", offline=a is None, active=0 if a is None else int(a * 1e9))
             for i, a in enumerate(actives_s)]
    return SimpleNamespace(config=SimpleNamespace(name="KV_x"), cluster=SimpleNamespace(leader=leader, replicas=peers))


def test_a_stream_leader_that_hears_no_quorum_of_its_replicas_is_cut_off():
    assert quorum_failure(_info("n0", 0.2, 0.4), 3.0) == ""
    assert quorum_failure(_info("n0", 0.2, 9.0), 3.0) == ""  # one replica lost: a quorum still
    assert "heard from 0 of its 2 replicas" in quorum_failure(_info("n0", 5.0, 9.0), 3.0)
    assert "heard from 0" in quorum_failure(_info("n0", None, None), 3.0)  # offline, or never heard
    assert "no leader" in quorum_failure(_info(None, 0.1, 0.1), 3.0)
    assert quorum_failure(SimpleNamespace(cluster=None), 3.0) == ""  # a single server: nothing to hear


def test_a_probe_that_found_no_jetstream_neither_raises_nor_clears_the_store_alarm():
    w = StoreWatch(failures_to_alarm=2)
    assert not w.observe(False, 1.0, "cut off", reachable=False)
    assert not w.observe(False, 2.0, "cut off", reachable=False)
    assert w.writable and w.unreachable == 2 and w.failures == 0
    assert not w.observe(False, 3.0, "no answer")
    assert w.observe(False, 4.0, "no answer") and not w.writable  # refused twice: the alarm
    assert not w.observe(False, 5.0, "cut off", reachable=False) and not w.writable  # held, not cleared
    assert w.observe(True, 6.0) and w.writable and w.unreachable == 0
