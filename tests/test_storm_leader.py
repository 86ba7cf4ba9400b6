"""Issue 38 §6, un-draining nodes under 20,000 queued jobs: the leader's mechanisms against a write
storm and a stalled lease, on an in-memory KV (bench/bench_storm.py measures them on a cluster).

* a round that explains every waiting job writes no job record for it (the reasons go on the
  board and out in a few batches);
* the lease is renewed while a slow plan runs;
* a round's writes stop at its time budget, starts first;
* a new term's stamps of waiting records do not hold its first decisions back;
* an older term's start that landed on a node this term gave away is taken back.
"""

from __future__ import annotations

import asyncio

from fakes import FakeElection, FakeKV
from waits import wait_for

from hfai.controller import transitions as tr
from hfai.controller.election import LeaseElection
from hfai.controller.leader import ExplainThrottle, Leader
from hfai.controller.plan import LoseNode, Planner, PlanNode, PlanSettings
from hfai.controller.policy import Start
from hfai.controller.waits import WaitBoard
from hfai.core.clock import FakeClock
from hfai.core.config import Config, ControllerConfig
from hfai.kv import KVCache
from hfai.protocol import decode, encode, names
from hfai.protocol.types import ChainState, JobRecord, JobSpec, Priority, evolve
from hfai.protocol.waits import WaitNotes


def job(job_id: str, user: str = "bob", prio: int = Priority.NORMAL.value, term: int = 0,
        nodes: int = 1) -> JobRecord:
    spec = JobSpec(name=job_id, entrypoint=("true",), workdir="/w", nodes=nodes, user=user, priority=prio)
    return JobRecord(id=job_id, spec=spec, state=ChainState.QUEUED, submit_ts=float(len(job_id)) + hash(job_id) % 997,
                     reason="queued", term=term)


def running(job_id: str, node: str, term: int = 0, prio: int = Priority.HIGH.value) -> JobRecord:
    j = tr.apply_start(job(job_id, prio=prio), Start(job_id, (node,)), 1.0, "10.0.0.1", 20000)
    return evolve(j, term=term)


class CountingKV(FakeKV):
    """A FakeKV that counts the writes of each key, and can hold the writes of some keys back."""

    def __init__(self, clock=None):
        super().__init__(clock)
        self.writes = 0
        self.held: set[str] = set()
        self.release = asyncio.Event()

    async def update(self, key, value, last=None):
        if key in self.held:
            await self.release.wait()
        self.writes += 1
        return await super().update(key, value, last)


def leader_with(records, nodes, election=None, clock=None, cc: ControllerConfig | None = None, published=None):
    kv = CountingKV()
    jobs = KVCache(kv, JobRecord)
    for r in records:
        jobs.put_local(r.id, r, kv._put(r.id, encode(r)))

    async def publish(subject: str, data: bytes) -> None:
        assert subject == names.WAITS_SUBJECT
        if published is not None:
            published.append(data)

    election = election or FakeElection(token=9)
    config = Config(controller=cc or ControllerConfig())
    board = {} if published is None else {"board": WaitBoard(jobs.revisions), "publish": publish}
    leader = Leader(config, None, kv, None, jobs, None, election, asyncio.Event(), clock=clock or FakeClock(), **board)
    plan_nodes = [PlanNode(n) for n in nodes]
    leader._node_states = lambda: plan_nodes
    return leader, kv


async def test_a_round_that_explains_every_waiting_job_writes_no_record_and_publishes_a_few_batches():
    waiting = [job(f"w{i:04d}") for i in range(600)]
    published: list[bytes] = []
    leader, kv = leader_with([running("big", "n0"), *waiting], ["n0"], published=published)
    await leader._plan_round()
    await leader._publish_waits()
    await leader._publisher
    assert kv.writes == 0, "a wait reason cost a job-record write"
    assert len(leader.board.notes) == 600
    # Every reason reaches a replica, in batches bounded by the reply budget.
    assert 1 <= len(published) <= 3
    replica = WaitBoard(leader.jobs.revisions)
    assert sum(replica.receive(b) for b in published) == 600
    shown = replica.shown(leader.jobs.values["w0007"])
    assert shown.why is not None and shown.why == leader.board.notes["w0007"][1] and shown.reason != "queued"


async def test_the_lease_is_renewed_while_a_slow_plan_runs():
    lease_kv = FakeKV()
    election = LeaseElection(lease_kv, "c0", ttl_s=0.6, poll_s=0.05, stall_s=5.0)
    task = election.start()
    try:
        await asyncio.wait_for(election.elected.wait(), 2.0)
        leader, _ = leader_with([job("w1")], [], election=election, clock=None)
        leader.fence = election.token
        slow_plan = leader.planner.plan
        first = lease_kv.messages[names.LEADER_KEY].revision

        def plan(*args):
            # An O(queue) plan of pure Python, longer than the lease's validity: it ends once the
            # lease was renewed twice meanwhile, which a plan that held the event loop never sees.
            wait_for(lambda: lease_kv.messages[names.LEADER_KEY].revision >= first + 2, 10.0,
                     "the lease to be renewed during the plan", poll=0.05)
            return slow_plan(*args)

        leader.planner.plan = plan
        await leader._plan_round()
        assert lease_kv.messages[names.LEADER_KEY].revision >= first + 2, "the lease was not renewed during the plan"
        assert election.is_leader
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_round_stops_writing_at_its_budget_and_writes_starts_first():
    clock = FakeClock()
    cc = ControllerConfig(lease_ttl_s=4.0)  # a round's budget: a quarter of it, 1 s
    waiting = [job(f"w{i}") for i in range(6)]
    leader, kv = leader_with(waiting, [f"n{i}" for i in range(6)], clock=clock, cc=cc)
    update = leader._update
    written: list[str] = []

    async def slow_update(job_id, change):
        written.append(job_id)
        clock.now += 0.4  # each write takes 0.4 s
        await update(job_id, change)

    leader._update = slow_update
    await leader._plan_round()
    assert len(written) == 3, written  # 0, 0.4, 0.8 s: the fourth would begin past the budget
    assert leader.wake.is_set()  # the rest goes in the next round, at once


async def test_a_new_terms_stamps_of_waiting_records_do_not_hold_its_first_start_back():
    first = job("first", prio=Priority.NORMAL.value, term=3)
    others = [job(f"low{i}", prio=Priority.LOW.value, term=3) for i in range(50)]
    leader, kv = leader_with([first, *others], ["n0"])
    leader._load_assignments = _nothing
    leader._reach_bucket_end = _nothing
    leader._publish_assignments = _nothing
    kv.held = {o.id for o in others}  # their stamps do not get through (yet)
    try:
        await asyncio.wait_for(leader._take_over(), 2.0)
        await asyncio.wait_for(leader._plan_round(), 2.0)
        assert leader._stamping is not None and not leader._stamping.done()
        started = decode(kv.messages["first"].value, JobRecord)
        assert started.state is ChainState.RUNNING and started.term == leader.fence
        kv.release.set()
        await asyncio.wait_for(leader._stamping, 2.0)
        assert all(decode(kv.messages[o.id].value, JobRecord).term == leader.fence for o in others)
    finally:
        kv.release.set()
        if leader._stamping is not None:
            leader._stamping.cancel()
            await asyncio.gather(leader._stamping, return_exceptions=True)


async def _nothing() -> None:
    return None


def test_an_older_terms_start_on_a_node_this_term_gave_away_is_taken_back():
    planner = Planner()
    mine, late = running("mine", "n0", term=9), running("late", "n0", term=8)
    for r in (mine, late):
        planner.observe(r)
    actions = planner.plan([PlanNode("n0")], PlanSettings(term=9), 10.0)
    assert LoseNode("late", "n0") in actions
    assert not any(a.job_id == "mine" for a in actions if isinstance(a, LoseNode))
    # Without a term (the simulator), or with no claim of this term on the node: nothing taken.
    assert not any(isinstance(a, LoseNode) for a in Planner().plan([PlanNode("n0")], PlanSettings(), 10.0))


def test_wait_notes_are_shown_until_the_record_changes_and_an_older_term_is_ignored():
    w = job("w")
    revisions = {"w": 5}
    leader_board, replica = WaitBoard(revisions), WaitBoard(revisions)
    why = tr.held_reason(w, "ops")  # any typed reason
    leader_board.note("w", 5, why)
    [batch] = leader_board.batches(term=4, budget_bytes=1 << 16)
    assert decode(batch.data, WaitNotes).term == 4
    assert replica.receive(batch.data) == 1
    assert replica.shown(w).reason == why.text()
    revisions["w"] = 6  # the record changed (started, held, updated): it says why itself
    assert replica.shown(w).reason == "queued"
    # A new term's stamp carries the note to the stamped revision.
    leader_board.restamp("w", 5, 6)
    assert replica.receive(next(iter(leader_board.batches(term=4, budget_bytes=1 << 16))).data) == 1
    assert replica.shown(w).reason == why.text()
    # A deposed leader's late batch changes nothing.
    stale = WaitBoard(revisions)
    stale.note("w", 7, tr.held_reason(w, "mallory"))
    replica.receive(next(iter(leader_board.batches(term=5, budget_bytes=1 << 16, full=True))).data)
    assert replica.receive(next(iter(stale.batches(term=4, budget_bytes=1 << 16))).data) == 0
    assert replica.shown(w).reason == why.text()


def test_a_reason_holds_for_a_copy_of_its_record_and_a_changed_record_is_explained_again_at_once():
    nodes, settings = [PlanNode("n0")], PlanSettings()
    planner = Planner()
    for r in (running("big", "n0"), job("w")):
        planner.observe(r)
    [first] = [a for a in planner.plan(nodes, settings, 10.0) if a.job_id == "w"]
    # The watch hands the leader an equal copy of the record: the reason still holds, unrepeated.
    planner.observe(evolve(planner.records["w"]))
    assert planner.shown(planner.records["w"]) == first.why
    assert not [a for a in planner.plan(nodes, settings, 11.0) if a.job_id == "w"]
    # Its priority changed (hfai update): it shows its record's reason, and is explained again at
    # the next round, not a wait_reason_interval_s later.
    planner.observe(tr.apply_update(planner.records["w"], Priority.LOW.value, None))
    assert planner.shown(planner.records["w"]) != first.why
    assert [a.why for a in planner.plan(nodes, settings, 12.0) if a.job_id == "w"] == [first.why]


async def test_a_round_writes_its_starts_before_it_works_out_every_wait():
    leader, _ = leader_with([job(f"w{i}") for i in range(20)], ["n0"])
    steps: list[tuple[str, object]] = []
    plan, update = leader.planner.plan, leader._update

    def logged_plan(nodes, settings, now):
        steps.append(("plan", settings.policy.explain_waits))
        return plan(nodes, settings, now)

    async def logged_update(job_id, change):
        steps.append(("write", job_id))
        await update(job_id, change)

    leader.planner.plan, leader._update = logged_plan, logged_update
    await leader._plan_round()  # the first round of a term explains
    assert [s[0] for s in steps] == ["plan", "write", "plan"], steps
    assert steps[0] == ("plan", False) and steps[2] == ("plan", True)
    assert len(leader.board.notes) == 19  # every other job's reason, noted


def test_explaining_rounds_take_at_most_a_tenth_of_the_leaders_time():
    throttle = ExplainThrottle(every_s=2.0, new_every_s=0.25)
    assert throttle.due(0.0, False)
    throttle.took(0.5)  # 20,000 waiting jobs on a busy host
    assert not throttle.due(2.0, False) and not throttle.due(1.0, True)
    assert throttle.due(5.0, False)
    throttle.took(0.01)  # the queue drained: the configured periods again
    assert throttle.due(7.0, False) and not throttle.due(7.1, True) and throttle.due(7.3, True)
