"""The agent's side of node health: both GPU sources report signals through one interface (NVML
through a stand-in for the pynvml module, which needs a GPU), the health watch drains on a
hardware fault and reports faults under runs, the operators' health operation, the exit of a run
on a faulted node reported as a platform stop, the metrics, and the controller's fold of fault
events and avoided nodes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from hfai.agent.gpu import NvmlGpus, SimulatedGpus
from hfai.agent.health import GpuSignal, HealthState, Signal
from hfai.agent.health_watch import HealthWatch
from hfai.agent.launchers import LAUNCH_EXEC
from hfai.agent.metrics import AgentMetrics
from hfai.agent.plan import Act, Action, LocalRun, RunPhase
from hfai.agent.service import Agent
from hfai.controller import transitions
from hfai.core.clock import FakeClock
from hfai.core.config import AgentConfig, Config
from hfai.protocol import encode, names
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import (
    HEALTH_CLEAR,
    HEALTH_FAULT,
    HEALTH_UNDRAIN,
    HEALTH_VALIDATE,
    ChainState,
    DesiredRun,
    GpuFaultEvent,
    JobRecord,
    JobSpec,
    NodeHealthRequest,
    NodeRecord,
    RunAssignment,
    RunEvent,
    RunEventKind,
)

T0 = 1_750_000_000.0


def _ra(job_id: str = "j1", run_id: int = 1) -> RunAssignment:
    return RunAssignment(job_id=job_id, run_id=run_id, name=job_id, user="u", group="default", priority=10, rank=0,
                         world_size=1, master_addr="127.0.0.1", master_port=29500, entrypoint=("true",), workdir="/",
                         desired=DesiredRun.RUN)


# ------------------------------------------------------------------------- the GPU sources


class _NvmlError(Exception):
    def __init__(self, value: int):
        super().__init__(f"NVML error {value}")
        self.value = value


class FakeNvml:
    """What NvmlGpus uses of pynvml, for two GPUs whose counters a test sets."""

    NVMLError = _NvmlError
    NVML_ERROR_TIMEOUT, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_NOT_SUPPORTED = 10, 15, 3
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 1, 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self):
        self.dbe = [0, 0]
        self.pending = [0, 0]
        self.throttle = [0, 0]
        self.lost = [False, False]
        self.xids: list[tuple[int, int]] = []  # (gpu, xid) events waiting

    def _gpu(self, h: int) -> int:
        if self.lost[h]:
            raise _NvmlError(self.NVML_ERROR_GPU_IS_LOST)
        return h

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 2
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetIndex(self, h): return h
    def nvmlEventSetCreate(self): return "set"
    def nvmlEventSetFree(self, s): pass
    def nvmlDeviceRegisterEvents(self, h, types, s): pass

    def nvmlEventSetWait_v2(self, s, timeout_ms):
        if not self.xids:
            raise _NvmlError(self.NVML_ERROR_TIMEOUT)
        gpu, xid = self.xids.pop(0)
        return type("Data", (), {"device": gpu, "eventData": xid})()

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter): return self.dbe[self._gpu(h)]
    def nvmlDeviceGetRetiredPagesPendingStatus(self, h): return self.pending[self._gpu(h)]
    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h): return self.throttle[self._gpu(h)]


def nvml_source(fake: FakeNvml) -> NvmlGpus:
    src = NvmlGpus.__new__(NvmlGpus)  # __init__ imports the real pynvml, which needs a driver
    src._nvml = fake
    src._handles = [0, 1]
    src._seen = {0: {}, 1: {}}
    src._events = src._register_xid_events()
    return src


def test_nvml_reports_xid_events_and_each_polled_condition_once_when_it_begins():
    fake = FakeNvml()
    src = nvml_source(fake)
    assert src.signals() == [] and not src.injectable
    fake.xids = [(1, 79), (0, 13)]
    fake.dbe[0] = 2
    fake.throttle[1] = 0x40  # hardware thermal slowdown
    got = src.signals()
    assert got == [GpuSignal(Signal.XID, 1, xid=79), GpuSignal(Signal.XID, 0, xid=13),
                   GpuSignal(Signal.DBE, 0, detail="count 0 -> 2"), GpuSignal(Signal.THERMAL, 1)]
    assert src.signals() == []  # the same conditions: nothing new
    fake.dbe[0], fake.pending[1], fake.throttle[1] = 3, 1, 0
    assert src.signals() == [GpuSignal(Signal.DBE, 0, detail="count 2 -> 3"), GpuSignal(Signal.RETIRED, 1)]
    fake.lost[1] = True
    assert src.signals() == [GpuSignal(Signal.LOST, 1)] and src.broken() == {1: "GPU is lost"}
    assert src.signals() == []


def test_simulated_gpus_take_injected_faults_and_stay_broken_until_cleared():
    src = SimulatedGpus(4)
    assert src.signals() == [] and src.broken() == {} and src.injectable
    src.inject(GpuSignal(Signal.XID, 2, xid=13))  # the job's error: the GPU is fine
    src.inject(GpuSignal(Signal.XID, 3, xid=79))
    assert src.signals() == [GpuSignal(Signal.XID, 2, xid=13), GpuSignal(Signal.XID, 3, xid=79)]
    assert src.signals() == [] and src.broken() == {3: "Xid 79 on GPU 3: fell off the bus"}
    assert src.sample(busy=True)[3].utilization == 0.0
    with pytest.raises(InvalidRequest, match="no GPU 4 here"):
        src.inject(GpuSignal(Signal.LOST, 4))
    src.clear()
    assert src.broken() == {}


# ------------------------------------------------------------------------- the health watch


def _watch(gpus, runs=(), published=None, accept=True):
    changed: list[int] = []
    sent = published if published is not None else []

    async def publish(ev: GpuFaultEvent) -> bool:
        if accept:
            sent.append(ev)
        return accept

    clock = FakeClock(wall_offset=T0)
    w = HealthWatch("n1", gpus, 1.0, 5.0, clock, changed=lambda: changed.append(1), runs=lambda: list(runs),
                    publish=publish)
    return w, changed, sent


def test_a_hardware_fault_drains_the_node_and_is_reported_under_each_run():
    gpus = SimulatedGpus()
    w, changed, sent = _watch(gpus, runs=[_ra("j1"), _ra("j2")])
    gpus.inject(GpuSignal(Signal.XID, 3, xid=79))
    [fault] = asyncio.run(w.poll())
    assert w.health.state is HealthState.FAULTED and changed == [1]
    assert w.drain_reason() == "GPU fault: Xid 79 on GPU 3: fell off the bus (back after hfai admin validate n1 passes)"
    assert [(e.job_id, e.run_id, e.fault) for e in sent] == [("j1", 1, fault), ("j2", 1, fault)]


def test_an_application_xid_is_reported_and_leaves_the_node_in_service():
    gpus = SimulatedGpus()
    w, changed, sent = _watch(gpus, runs=[_ra("j1")])
    gpus.inject(GpuSignal(Signal.XID, 0, xid=13))
    gpus.inject(GpuSignal(Signal.THERMAL, 1))  # a warning: not the job's news
    asyncio.run(w.poll())
    assert w.health.state is HealthState.HEALTHY and changed == [] and w.drain_reason() == ""
    assert [e.fault.why.params["xid"] for e in sent] == ["13"]


def test_fault_reports_nats_refused_are_sent_at_a_later_poll():
    gpus = SimulatedGpus()
    published: list[GpuFaultEvent] = []
    w, _, _ = _watch(gpus, runs=[_ra("j1")], published=published, accept=False)
    gpus.inject(GpuSignal(Signal.XID, 0, xid=31))
    asyncio.run(w.poll())
    assert published == [] and len(w._pending) == 1

    async def accept(ev):
        published.append(ev)
        return True

    w.publish = accept
    asyncio.run(w.poll())
    assert len(published) == 1 and not w._pending


def _ask(w: HealthWatch, req: NodeHealthRequest):
    return asyncio.run(w._dispatch(names.agent_op_subject("n1", "root", names.AGENT_OP_HEALTH), encode(req)))


def test_the_operators_health_operation_injects_validates_and_undrains():
    gpus = SimulatedGpus()
    w, changed, _ = _watch(gpus)
    _ask(w, NodeHealthRequest(action=HEALTH_FAULT, xid=74, gpu=5))
    asyncio.run(w.poll())
    assert w.health.state is HealthState.FAULTED
    with pytest.raises(InvalidRequest, match="drained by a fault .* --force"):
        _ask(w, NodeHealthRequest(action=HEALTH_UNDRAIN))
    failed = _ask(w, NodeHealthRequest(action=HEALTH_VALIDATE))
    assert not failed.check.ok and "GPU 5" in failed.check.detail and failed.fault is not None
    _ask(w, NodeHealthRequest(action=HEALTH_CLEAR))
    asyncio.run(w.clock.advance(1.0))
    passed = _ask(w, NodeHealthRequest(action=HEALTH_VALIDATE))
    assert passed.check.ok and passed.fault is None and w.health.state is HealthState.HEALTHY
    assert changed == [1, 1]  # drained, then back
    with pytest.raises(InvalidRequest, match="needs its code"):
        _ask(w, NodeHealthRequest(action=HEALTH_FAULT))


def test_undrain_forced_without_a_check():
    gpus = SimulatedGpus()
    w, _, _ = _watch(gpus)
    gpus.inject(GpuSignal(Signal.LOST, 0))
    asyncio.run(w.poll())
    reply = _ask(w, NodeHealthRequest(action=HEALTH_UNDRAIN, force=True))
    assert reply.fault is None and "forced" in reply.message


def test_faults_are_injected_into_simulated_gpus_only():
    w, _, _ = _watch(nvml_source(FakeNvml()))
    with pytest.raises(InvalidRequest) as e:
        _ask(w, NodeHealthRequest(action=HEALTH_FAULT, xid=79))
    assert str(e.value) == "node n1 has real GPUs (nvml): faults are injected into simulated GPUs only"


def test_a_step_that_overruns_fails_the_check():
    import threading

    from hfai.agent.health_check import Step, run_check

    release = threading.Event()  # the step runs until the check is over: it overruns whatever the load

    async def checked():
        try:
            return await run_check([Step("slow", lambda: release.wait() and ""), Step("ok", lambda: "")], 0.05,
                                   lambda: T0)
        finally:
            release.set()  # before asyncio.run waits for the step's thread

    check = asyncio.run(checked())
    assert not check.ok and check.detail == "slow: took longer than 0.05 s"


# ------------------------------------------------------------------------- the agent


def test_a_run_that_fails_on_a_faulted_node_is_reported_stopped_by_the_platform(tmp_path: Path):
    cfg = AgentConfig(node="n1", state_dir=str(tmp_path / "state"), env_root=str(tmp_path / "envs"), gpu_source="sim",
                      run_as="agent", launcher=LAUNCH_EXEC)
    agent = Agent(Config(agent=cfg))
    ra = _ra()
    failed = {ra.key: LocalRun(ra.key, ra, RunPhase.EXITED, exit_code=1)}
    kind, fields = agent.reports.event(Action(Act.REPORT_EXIT, ra.key, ra), failed)
    assert kind is RunEventKind.EXITED and not fields["platform_stopped"]
    agent.gpus.inject(GpuSignal(Signal.XID, 0, xid=79))
    asyncio.run(agent.health.poll())
    kind, fields = agent.reports.event(Action(Act.REPORT_EXIT, ra.key, ra), failed)
    assert fields["platform_stopped"] and fields["message"] == "GPU fault: Xid 79 on GPU 0: fell off the bus"
    finished = {ra.key: LocalRun(ra.key, ra, RunPhase.EXITED, exit_code=0)}
    assert not agent.reports.event(Action(Act.REPORT_EXIT, ra.key, ra), finished)[1]["platform_stopped"]


def test_metrics_say_whether_the_node_is_healthy_and_count_xids():
    gpus = SimulatedGpus()
    w, _, _ = _watch(gpus)
    m = AgentMetrics(lambda: 0, xids=lambda: w.health.xids)
    record = NodeRecord(name="n1", group="g", address="a", ts=T0, seq=1)
    m.heartbeat(record)
    assert 'hfai_node_healthy{node="n1"} 1.0' in generate_latest(m.registry).decode()
    gpus.inject(GpuSignal(Signal.XID, 3, xid=79))
    gpus.inject(GpuSignal(Signal.XID, 3, xid=79))
    asyncio.run(w.poll())
    m.heartbeat(NodeRecord(name="n1", group="g", address="a", ts=T0, seq=2, fault=w.health.fault))
    text = generate_latest(m.registry).decode()
    assert 'hfai_node_healthy{node="n1"} 0.0' in text and 'hfai_gpu_xid_total{code="79",node="n1"} 2.0' in text


# ------------------------------------------------------------------------- the controller


def _running(nodes=("n1", "n2")) -> JobRecord:
    spec = JobSpec(name="t", entrypoint=("x",), workdir="/", nodes=len(nodes))
    return JobRecord(id="j1", spec=spec, state=ChainState.RUNNING, submit_ts=T0, run_id=1, nodes=nodes,
                     started_ts=T0)


def test_a_fault_event_is_kept_on_the_job_once():
    gpus = SimulatedGpus()
    w, _, sent = _watch(gpus, runs=[_ra("j1")])
    gpus.inject(GpuSignal(Signal.XID, 0, xid=13))
    asyncio.run(w.poll())
    [ev] = sent
    job = _running()
    after = transitions.apply_gpu_fault(job, ev)
    assert after is not None and after.state is ChainState.RUNNING and after.reason == job.reason
    assert after.history == job.history  # only the states entered: usage and the timeline count them
    assert after.faults[-1].reason.startswith("Xid 13 on GPU 0 of n1: graphics engine exception")
    assert transitions.apply_gpu_fault(after, ev) is None  # redelivered
    stale = GpuFaultEvent(node="n1", job_id="j1", run_id=0, fault=ev.fault)
    assert transitions.apply_gpu_fault(job, stale) is None


def test_a_platform_stop_or_a_lost_node_makes_the_next_start_avoid_the_node():
    job = _running()
    ev = RunEvent(event=RunEventKind.EXITED, node="n2", job_id="j1", run_id=1, ts=T0, exit_code=-9,
                  platform_stopped=True, message="GPU fault: Xid 79 on GPU 0: fell off the bus")
    after = transitions.apply_event(job, ev, T0 + 1)
    assert after.state is ChainState.SUSPENDING and after.avoid == ("n2",)
    lost = transitions.apply_node_lost(job, "n1", T0 + 1)
    assert lost.state is ChainState.SUSPENDED and lost.avoid == ("n1",)


def test_the_periodic_check_runs_only_while_the_node_is_idle():
    gpus = SimulatedGpus()
    runs: list[RunAssignment] = []
    w, _, _ = _watch(gpus)
    w.runs = lambda: list(runs)
    assert not w.idle_check_due()  # not set
    w.idle_check_s = 60.0
    assert w.idle_check_due()
    asyncio.run(w.validate())
    assert not w.idle_check_due()
    asyncio.run(w.clock.advance(60.0))
    assert w.idle_check_due()
    runs.append(_ra())
    assert not w.idle_check_due()  # a job runs: never under it
