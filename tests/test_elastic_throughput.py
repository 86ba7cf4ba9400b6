"""A job's throughput measured with no change to its code (hfai._throughput), relayed by the agent
(agent/throughput.py), kept per size in its record (controller/throughput.py), and weighed by the
gain policy with its measured restart cost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from hfai import _throughput
from hfai._throughput import THROUGHPUT_FILE, Meter
from hfai.agent.throughput import Relay, parse
from hfai.controller.policy import JobView, NodeView, PolicyConfig, Resize
from hfai.controller.policy.gain import decide as gain_decide
from hfai.controller.throughput import MEMORY_S, apply_throughput, merged
from hfai.controller.views import job_view
from hfai.protocol import decode, encode
from hfai.protocol.types import (
    ChainState,
    DesiredRun,
    JobEvent,
    JobRecord,
    JobSpec,
    Priority,
    RunAssignment,
    RunThroughput,
    SizeRate,
)

NORMAL = Priority.NORMAL.value


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def window(cdir) -> dict:
    with open(os.path.join(cdir, THROUGHPUT_FILE)) as f:
        return json.loads(f.read())


# ------------------------------------------------------------------------------ the job's side


def test_steps_are_counted_from_the_first_and_a_window_written_when_it_ends(tmp_path):
    clock = FakeClock()
    m = Meter(str(tmp_path), interval_s=10.0, clock=clock)
    for _ in range(21):  # the first opens the window; 20 steps in 10 s
        m.mark("suspend")
        clock.t += 0.5
    w = window(tmp_path)
    assert w["rate"] == pytest.approx(2.0) and w["seconds"] == pytest.approx(10.0) and w["unit"] == "steps"
    assert w["seq"] == 1


def test_a_process_counts_one_kind_of_step_and_an_explicit_report_replaces_them(tmp_path):
    clock = FakeClock()
    m = Meter(str(tmp_path), interval_s=10.0, clock=clock)
    for _ in range(11):
        m.mark("loader")
        m.mark("suspend")  # the same step, asked about too: not counted twice
        clock.t += 1.0
    assert window(tmp_path)["rate"] == pytest.approx(1.0)
    for _ in range(11):
        m.mark("report", 64.0, "samples")
        m.mark("loader")  # its steps count no more
        clock.t += 1.0
    w = window(tmp_path)
    assert w["unit"] == "samples" and w["rate"] == pytest.approx(64.0)


def test_report_throughput_checks_its_arguments_and_is_public():
    import hfai
    import hfai.client

    assert hfai.report_throughput is hfai.client.report_throughput is _throughput.report_throughput
    with pytest.raises(TypeError):
        hfai.report_throughput("12")
    with pytest.raises(ValueError):
        hfai.report_throughput(12, unit="images")


def test_a_script_that_only_asks_for_the_suspend_flag_reports_its_steps(tmp_path):
    script = ("import time, hfai\n"
              "for _ in range(40):\n"
              "    hfai.receive_suspend_command()\n"
              "    time.sleep(0.05)\n")
    env = {**os.environ, "HFAI_CONTROL_DIR": str(tmp_path), "HFAI_THROUGHPUT_INTERVAL_S": "1"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    w = window(tmp_path)
    assert w["unit"] == "steps" and 0 < w["rate"] <= 20.0 and w["seconds"] >= 1.0


def test_the_window_under_way_is_written_when_the_process_exits(tmp_path):
    clock = FakeClock()
    m = Meter(str(tmp_path), interval_s=20.0, clock=clock)
    m.close()  # nothing counted: nothing written
    assert not os.path.exists(os.path.join(tmp_path, THROUGHPUT_FILE))
    for _ in range(11):  # 10 steps in 5 s of a 20 s window
        m.mark("suspend")
        clock.t += 0.5
    m.close()
    w = window(tmp_path)
    assert w["rate"] == pytest.approx(10 / 5.5) and w["seconds"] == pytest.approx(5.5)
    # A job shorter than one interval is measured too: the process writes its window as it exits.
    script = ("import time, hfai\n"
              "for _ in range(10):\n"
              "    hfai.receive_suspend_command()\n"
              "    time.sleep(0.02)\n")
    env = {**os.environ, "HFAI_CONTROL_DIR": str(tmp_path / "short"), "HFAI_THROUGHPUT_INTERVAL_S": "600"}
    os.mkdir(tmp_path / "short")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=60)
    w = window(tmp_path / "short")
    assert w["seq"] == 1 and 0 < w["seconds"] < 600 and w["rate"] > 0


# ------------------------------------------------------------------------------ the agent's relay


def assignment(rank: int = 0) -> RunAssignment:
    return RunAssignment(job_id="j1", run_id=2, name="n", user="u", group="default", priority=NORMAL, rank=rank,
                         world_size=2, master_addr="", master_port=0, entrypoint=("x",), workdir="/",
                         desired=DesiredRun.RUN)


def test_the_file_is_checked_as_the_jobs_own():
    good = json.dumps({"rate": 2.5, "seconds": 20.0, "unit": "steps", "startup_s": 3.0}).encode()
    assert parse(good) is not None and parse(good).rate == 2.5
    for bad in (b"", b"not json", b"[1, 2]", json.dumps({"rate": "nan", "seconds": 1}).encode(),
                json.dumps({"rate": 1.0, "seconds": 0}).encode(), json.dumps({"rate": -1, "seconds": 1}).encode(),
                json.dumps({"rate": 1.0, "seconds": 1, "unit": "bogus"}).encode(), b"{" + b" " * 600 + b"}"):
        assert parse(bad) is None, bad


def test_rank_0_relays_a_new_window_at_most_once_an_interval():
    relay = Relay(interval_s=15.0)
    raw = json.dumps({"seq": 1, "rate": 2.0, "seconds": 10.0}).encode()
    assert relay.due(assignment(rank=1), raw, 0.0) is None  # not rank 0: its node does not relay
    assert relay.due(assignment(), raw, 0.0) is not None
    newer = json.dumps({"seq": 2, "rate": 2.1, "seconds": 10.0}).encode()
    assert relay.due(assignment(), raw, 20.0) is None  # the same window again
    assert relay.due(assignment(), newer, 10.0) is None  # too soon
    assert relay.due(assignment(), newer, 16.0) is not None
    relay.forget(set())
    assert relay.due(assignment(), newer, 17.0) is not None  # a new run key starts afresh


def test_an_exited_runs_last_window_is_relayed_before_its_exit_is_reported(tmp_path):
    import asyncio

    from hfai.agent.plan import LocalRun, RunPhase
    from hfai.agent.reports import Reports
    from hfai.protocol.types import RunEventKind

    relay = Relay(interval_s=15.0)
    first = json.dumps({"seq": 1, "rate": 2.0, "seconds": 20.0}).encode()
    last = json.dumps({"seq": 2, "rate": 3.0, "seconds": 4.0}).encode()
    assert relay.due(assignment(), first, 0.0) is not None
    assert relay.due(assignment(), last, 5.0) is None  # too soon for an alive run's
    assert relay.due(assignment(), last, 5.0, final=True).rate == 3.0  # not for an exited one's
    assert relay.due(assignment(), last, 6.0, final=True) is None  # once

    class Store:
        def control_dir(self, key):
            return tmp_path

    class Clock:
        t = 0.0

        def boottime(self):
            return self.t

        def time(self):
            return 1000.0 + self.t

    sent: list[RunThroughput] = []

    class JetStream:
        async def publish(self, subject, data, **kw):
            sent.append(decode(data, RunThroughput))

    clock = Clock()
    reports = Reports("a", Store(), None, None, clock, timeout_s=1.0, throughput_relay_s=15.0)
    reports.connect(JetStream())
    ra = assignment()
    (tmp_path / THROUGHPUT_FILE).write_bytes(first)
    asyncio.run(reports.relay_throughput({ra.key: LocalRun(ra.key, ra, RunPhase.ALIVE)}))
    (tmp_path / THROUGHPUT_FILE).write_bytes(last)  # written as the job exited, 5 s later
    clock.t = 5.0
    exited = LocalRun(ra.key, ra, RunPhase.EXITED, exit_code=0)
    asyncio.run(reports.relay_throughput({ra.key: exited}))
    assert [e.rate for e in sent] == [2.0, 3.0]
    clock.t = 30.0
    (tmp_path / THROUGHPUT_FILE).write_bytes(first)
    asyncio.run(reports.relay_throughput({ra.key: replace(exited, sent=frozenset({RunEventKind.EXITED}))}))
    assert len(sent) == 2  # its exit reported: nothing more of it


# ------------------------------------------------------------------------------ the record


def record(nodes=("a", "b"), **kw) -> JobRecord:
    spec = JobSpec(name="e", user="u", entrypoint=("x",), workdir="/", nodes=4, min_nodes=1, max_nodes=4)
    return JobRecord(id="j1", spec=spec, state=ChainState.RUNNING, submit_ts=0.0, run_id=2, nodes=nodes,
                     started_ts=500.0, **kw)


def event(rate: float, seconds: float = 20.0, node: str = "a", unit: str = "steps", startup_s: float = 0.0):
    return RunThroughput(node=node, job_id="j1", run_id=2, ts=600.0, rate=rate, seconds=seconds, unit=unit,
                         startup_s=startup_s)


def test_windows_are_kept_per_size_and_only_from_the_running_rank_0():
    assert decode(encode(event(2.0)), RunThroughput) == event(2.0)
    job = apply_throughput(record(), event(2.0))
    assert job is not None and job.throughput == (SizeRate(nodes=2, rate=2.0, seconds=20.0),)
    job = apply_throughput(job, event(4.0))
    assert job.throughput[0].rate == pytest.approx(3.0) and job.throughput[0].seconds == 40.0
    assert job.throughput_unit == "steps"
    assert apply_throughput(job, event(4.0, node="b")) is None  # not rank 0's node
    assert apply_throughput(job, replace(event(4.0), run_id=1)) is None  # an earlier run's late window
    # A suspending job's last window (written as it exited) counts; a suspended one's does not.
    assert apply_throughput(replace(job, state=ChainState.SUSPENDING), event(4.0)) is not None
    assert apply_throughput(replace(job, state=ChainState.SUSPENDED), event(4.0)) is None
    # A size it ran at before keeps its own rate; a new unit starts the measurements over.
    four = apply_throughput(replace(job, nodes=("a", "b", "c", "d")), event(7.0))
    assert [(r.nodes, r.rate) for r in four.throughput] == [(2, pytest.approx(3.0)), (4, 7.0)]
    samples = apply_throughput(four, event(640.0, unit="samples"))
    assert [(r.nodes, r.rate) for r in samples.throughput] == [(4, 640.0)] and samples.throughput_unit == "samples"
    # Old measurements weigh at most MEMORY_S against a new window.
    old = (SizeRate(nodes=2, rate=1.0, seconds=100 * MEMORY_S),)
    assert merged(old, 2, 2.0, MEMORY_S)[0].rate == pytest.approx(1.5)
    # A rigid job is measured for MEMORY_S at its size, then its record is left alone.
    rigid = replace(record(), spec=replace(record().spec, nodes=2, min_nodes=0, max_nodes=0))
    rigid = apply_throughput(rigid, event(2.0, seconds=MEMORY_S))
    assert rigid.throughput == (SizeRate(nodes=2, rate=2.0, seconds=MEMORY_S),)
    assert apply_throughput(rigid, event(3.0)) is None
    assert apply_throughput(job, event(4.0, seconds=MEMORY_S)) is not None  # an elastic one, always
    # The policy sees them.
    view = job_view(four)
    assert view.throughput == ((2, pytest.approx(3.0)), (4, 7.0)) and view.throughput_unit == "steps"


def test_the_restart_cost_is_the_last_interruption_and_the_next_runs_startup():
    history = (JobEvent(ts=100.0, state=ChainState.RUNNING), JobEvent(ts=200.0, state=ChainState.SUSPENDING),
               JobEvent(ts=230.0, state=ChainState.SUSPENDED), JobEvent(ts=240.0, state=ChainState.RUNNING))
    job = apply_throughput(record(history=history, suspend_count=1), event(2.0, startup_s=12.0))
    assert job.restart_s == pytest.approx(42.0)
    assert job_view(job).restart_s == pytest.approx(42.0)
    # Never interrupted: nothing measured yet.
    assert apply_throughput(record(), event(2.0, startup_s=12.0)).restart_s == 0.0


def test_the_gpu_utilisation_of_the_jobs_nodes_is_kept_beside_each_window():
    from hfai.controller.throughput import nodes_utilization
    from hfai.protocol.nodes import GpuStat, NodeRecord
    from hfai.protocol.speedup import UTIL_MIN_S

    def node(name, *utils):
        gpus = tuple(GpuStat(index=i, name="g", utilization=u, memory_used=0, memory_total=1, temperature=0.0,
                             power_w=0.0) for i, u in enumerate(utils))
        return NodeRecord(name=name, group="default", address="", ts=0.0, seq=1, gpus=gpus)

    records = {"a": node("a", 20.0, 40.0), "b": node("b", 30.0, 30.0), "c": node("c")}
    assert nodes_utilization(records, ("a", "b")) == pytest.approx(30.0)
    assert nodes_utilization(records, ("c", "z")) is None  # no GPU reported: unknown
    job = apply_throughput(record(), event(2.0, seconds=UTIL_MIN_S / 2), gpu_util=30.0)
    assert job.throughput[0].gpu_util == 30.0 and job_view(job).gpu_util == ()  # not yet persistent
    job = apply_throughput(job, event(2.0, seconds=UTIL_MIN_S / 2), gpu_util=50.0)
    job = apply_throughput(job, event(2.0, seconds=20.0), gpu_util=None)  # unknown: kept as it was
    assert job.throughput[0].gpu_util == pytest.approx(40.0) and job.throughput[0].util_s == UTIL_MIN_S
    assert job_view(job).gpu_util == ((2, pytest.approx(40.0)),)
    assert decode(encode(job), JobRecord) == job


def test_a_job_that_keeps_its_gpus_idle_is_not_grown_however_well_it_seemed_to_scale():
    nodes = [NodeView(f"n{i}") for i in range(4)]
    job = JobView("j", "u", NORMAL, 2, 0.0, ChainState.RUNNING, held=("n0", "n1"), started_ts=0.0, min_nodes=1,
                  max_nodes=4, throughput=((1, 1.0), (2, 2.0)))
    config = PolicyConfig(slice_s=600.0, resize_cost_s=60.0)
    busy = replace(job, gpu_util=((1, 95.0), (2, 90.0)))
    assert [(type(d), d.size) for d in gain_decide([busy], nodes, 10_000.0, config)] == [(Resize, 4)]
    idle = replace(job, gpu_util=((1, 95.0), (2, 25.0)))
    assert gain_decide([idle], nodes, 10_000.0, config) == []
    # Idle already at one node: its second node is surplus, given first to a job that waits.
    waiting = JobView("w", "v", NORMAL, 1, 5_000.0, ChainState.QUEUED)
    held = replace(job, held=("n0", "n1", "n2", "n3"), gpu_util=((1, 25.0),))
    out = gain_decide([held, waiting], nodes, 10_000.0, config)
    assert [(type(d), d.job_id, d.size) for d in out if isinstance(d, Resize)] == [(Resize, "j", 3)]


# ------------------------------------------------------------------------------ the policy


def test_a_measured_restart_cost_decides_whether_a_resize_pays():
    nodes = [NodeView(f"n{i}") for i in range(4)]
    # 2 -> 4 nodes gains 30% (Amdahl-like): over a 600 s slice it pays for a 60 s restart, not a 300 s one.
    job = JobView("j", "u", NORMAL, 2, 0.0, ChainState.RUNNING, held=("n0", "n1"), started_ts=0.0, min_nodes=1,
                  max_nodes=4, throughput=((1, 1.0), (2, 1.6), (4, 2.1)), throughput_unit="samples")
    config = PolicyConfig(slice_s=600.0, resize_cost_s=60.0)
    out = gain_decide([job], nodes, 10_000.0, config)
    assert [(type(d), d.size) for d in out] == [(Resize, 4)]
    assert "samples/s expected" in out[0].reason
    assert gain_decide([replace(job, restart_s=300.0)], nodes, 10_000.0, config) == []
    assert [type(d) for d in gain_decide([replace(job, restart_s=20.0)], nodes, 10_000.0, config)] == [Resize]


# ------------------------------------------------------------------------------ seen by users


def test_status_and_the_job_page_show_the_measured_rates_the_curve_and_the_restart_cost():
    from hfai.cli.render import job_details
    from hfai.web.views import job_detail

    job = replace(record(), throughput=(SizeRate(nodes=1, rate=10.0), SizeRate(nodes=2, rate=19.0)),
                  throughput_unit="samples", restart_s=42.0)
    text = job_details(job)
    assert "throughput 1 node: 10 samples/s\n           2 nodes: 19 samples/s\n" in text
    assert "fitted speedup on 1..4 nodes: 1.00 1.9" in text and "flat past" not in text
    assert "a restart costs it" in text
    page = job_detail(job)["throughput"]
    assert page[0] == "1 node: 10 samples/s" and len(page) == 4
    assert "throughput" not in job_details(record()).split("history:")[0]  # nothing measured, nothing said


def test_status_and_the_job_page_show_how_busy_the_gpus_were_per_size_and_a_size_too_idle_to_grow_past():
    from hfai.cli.render import job_details
    from hfai.protocol.speedup import UTIL_MIN_S
    from hfai.web.views import job_detail

    busy = SizeRate(nodes=1, rate=20.0, seconds=900.0, gpu_util=93.4, util_s=900.0)
    idle = SizeRate(nodes=2, rate=41.2, seconds=900.0, gpu_util=35.0, util_s=UTIL_MIN_S)
    job = replace(record(), throughput=(busy, idle), throughput_unit="steps")
    text = job_details(job)
    assert "throughput 1 node: 20 steps/s, GPUs 93% busy\n" in text
    assert "2 nodes: 41.2 steps/s, GPUs 35% busy (too idle to grow past)\n" in text
    # The curve shown is the one the policy sizes it by: flat past the idle size.
    assert "fitted speedup on 1..4 nodes: 1.00 2.00 2.00 2.00 (flat past 2 nodes: its GPUs sat idle there)" in text
    page = job_detail(job)["throughput"]
    assert page[:2] == ["1 node: 20 steps/s, GPUs 93% busy",
                        "2 nodes: 41.2 steps/s, GPUs 35% busy (too idle to grow past)"]
    assert page[2].endswith("(flat past 2 nodes: its GPUs sat idle there)")
    # Idle, but not yet for long enough to count: said so, and the curve is not capped.
    short = replace(job, throughput=(busy, replace(idle, util_s=120.0)))
    text = job_details(short)
    assert "2 nodes: 41.2 steps/s, GPUs 35% busy (too idle to grow past once so for 5m: 2m so far)" in text
    assert "flat past" not in text
    # Not said where it means nothing: at its largest size, and of a rigid job.
    top = replace(job, throughput=(busy, replace(idle, nodes=4)))
    assert "GPUs 35% busy\n" in job_details(top) and "too idle" not in job_details(top)
    rigid = replace(job, spec=replace(job.spec, min_nodes=0, max_nodes=0, nodes=2))
    assert "GPUs 35% busy" in job_details(rigid) and "too idle" not in job_details(rigid)
    # No heartbeat said: the rate alone.
    quiet = replace(job, throughput=(SizeRate(nodes=1, rate=20.0),))
    assert "throughput 1 node: 20 steps/s\n" in job_details(quiet)


def test_a_job_measured_at_fewer_than_two_sizes_grows_as_hfai_grows_it_whatever_the_slice():
    from hfai.controller.policy import HFAI

    nodes = [NodeView(f"n{i}") for i in range(4)]
    config = PolicyConfig(slice_s=1.0, resize_cost_s=120.0)  # a restart longer than the slice
    for measured in ((), ((1, 5.0),)):
        job = JobView("j", "u", NORMAL, 4, 0.0, ChainState.RUNNING, held=("n0",), started_ts=0.0, min_nodes=1,
                      max_nodes=4, throughput=measured)
        hfai = HFAI.decide([job], nodes, 100.0, config)
        assert [(type(d), d.size) for d in hfai] == [(Resize, 4)]
        assert [(type(d), d.size) for d in gain_decide([job], nodes, 100.0, config)] == [(Resize, 4)], measured


def test_an_hfai_data_loader_counts_its_batches_as_steps(tmp_path):
    script = ("import time\n"
              "from hfai.data import DataLoader\n"
              "for _ in DataLoader(list(range(120)), batch_size=2, shuffle=False):\n"
              "    time.sleep(0.05)\n")
    env = {**os.environ, "HFAI_CONTROL_DIR": str(tmp_path), "HFAI_THROUGHPUT_INTERVAL_S": "1"}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    w = window(tmp_path)
    assert w["unit"] == "steps" and 0 < w["rate"] <= 20.0


def test_a_runs_last_window_reaches_the_leader_before_its_exit(tmp_path):
    """A real run that exits before its first interval is over: its window, written as it exits,
    is relayed in the same reconcile round as its exit report, and before it."""
    import asyncio
    from types import SimpleNamespace

    from waits import wait_for

    from hfai.agent.plan import RunPhase
    from hfai.agent.service import Agent
    from hfai.core.config import AgentConfig, Config
    from hfai.protocol.types import NodeAssignment, RunEventKind

    cfg = AgentConfig(node="n0", state_dir=str(tmp_path / "state"), env_root=str(tmp_path / "envs"),
                      gpu_source="sim", run_as="agent")
    agent = Agent(Config(agent=cfg))
    script = "import hfai\nfor _ in range(20):\n    hfai.receive_suspend_command()\n"
    ra = RunAssignment(job_id="j1", run_id=1, name="j1", user="u", group="default", priority=NORMAL, rank=0,
                       world_size=1, master_addr="127.0.0.1", master_port=20000,
                       entrypoint=(sys.executable, "-c", script), workdir=str(tmp_path), desired=DesiredRun.RUN)
    agent.assignment.on_assignment(SimpleNamespace(value=encode(NodeAssignment(node="n0", fence=1, runs=(ra,))),
                                                   operation=None))
    order: list[str] = []

    async def publish(ra, kind, **fields):
        order.append(kind.value)
        return True

    async def publish_throughput(ev):
        order.append(f"throughput {ev.rate > 0} {ev.seconds < 20}")

    agent.reports.publish = publish  # type: ignore[method-assign]
    agent.reports._publish_throughput = publish_throughput  # type: ignore[method-assign]
    asyncio.run(agent.reconcile())  # starts it

    def exited() -> bool:
        run = agent.store.snapshot().get(ra.key)
        return run is not None and run.phase is RunPhase.EXITED

    wait_for(exited, 60.0, "the run to exit", poll=0.01)
    asyncio.run(agent.reconcile())
    assert agent.store.snapshot()[ra.key].exit_code == 0
    # Its window is relayed once, before the exit report (STARTED goes out with the exit).
    assert order == ["throughput True True", RunEventKind.STARTED.value, RunEventKind.EXITED.value]
