"""The agent's health watch: it polls the GPU source every ``[agent] health_interval_s``, keeps the
node's health (agent/health.py decides), tells the agent to heartbeat at once when the node is
drained or back, reports each fault under a running job to the leader (GpuFaultEvent: the job's
history shows it), runs the validator (agent/health_check.py), and serves the operators' agent
operation ``health`` (``hfai admin fault``, ``hfai admin validate``, ``hfai node undrain``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable

from hfai.agent.gpu import GpuSource, SimulatedGpus
from hfai.agent.health import GpuSignal, NodeHealth, Signal
from hfai.agent.health_allreduce import AllreduceSettings
from hfai.agent.health_check import run_check, steps_for
from hfai.core import nats as _nats
from hfai.core.clock import Clock
from hfai.core.daemon import raise_if_cancelled
from hfai.protocol import decode, names
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import (
    HEALTH_CLEAR,
    HEALTH_FAULT,
    HEALTH_UNDRAIN,
    HEALTH_VALIDATE,
    GpuFault,
    GpuFaultEvent,
    NodeHealthReply,
    NodeHealthRequest,
    RunAssignment,
)

log = logging.getLogger(__name__)

#: Fault reports not yet acknowledged by JetStream are kept (and retried each poll) up to this many.
PENDING_MAX = 256


class HealthWatch:
    """``changed`` is called when the node's drain reason changes (the agent heartbeats at once);
    ``runs`` gives the runs alive on the node; ``publish`` sends one fault event (True once
    JetStream acknowledged it)."""

    def __init__(self, node: str, gpus: GpuSource, interval_s: float, check_step_s: float, clock: Clock,
                 changed: Callable[[], None], runs: Callable[[], list[RunAssignment]],
                 publish: Callable[[GpuFaultEvent], Awaitable[bool]], idle_check_s: float = 0.0,
                 allreduce: AllreduceSettings | None = None):
        self.node = node
        self.gpus = gpus
        self.interval_s = interval_s
        self.check_step_s = check_step_s
        self.idle_check_s = idle_check_s  # the validator runs this often while no run is alive (0: never)
        self.allreduce = allreduce or AllreduceSettings()  # its in-node all-reduce step
        self.clock = clock
        self.changed = changed
        self.runs = runs
        self.publish = publish
        self.health = NodeHealth()
        self._pending: deque[GpuFaultEvent] = deque(maxlen=PENDING_MAX)

    async def serve(self, nc) -> None:
        await nc.subscribe(names.agent_op_wildcard(self.node, names.AGENT_OP_HEALTH), cb=self._on_request)

    def drain_reason(self) -> str:
        return self.health.drain_reason(self.node)

    async def loop(self) -> None:
        while True:
            raise_if_cancelled()
            await self.poll()
            if self.idle_check_due():
                await self.validate()
            await self.clock.sleep(self.interval_s)

    def idle_check_due(self) -> bool:
        """Whether the periodic check is due: set, no run alive, and none for ``idle_check_s``."""
        if self.idle_check_s <= 0 or self.runs():
            return False
        last = self.health.check
        return last is None or self.clock.time() - last.ts >= self.idle_check_s

    async def poll(self) -> list[GpuFault]:
        """Take in what the GPUs went through since the last poll; returns the new faults."""
        before = self.health.fault
        faults = self.health.observe(self.gpus.signals(), self.clock.time())
        for f in faults:
            log.warning("GPU fault: %s%s", f.text(), "; draining this node" if f is self.health.fault else "")
        if self.health.fault is not before:
            self.changed()
        runs = self.runs() if faults else []
        for f in faults:
            if f.why.params.get("kind") in ("hardware", "application"):
                self._pending.extend(GpuFaultEvent(node=self.node, job_id=ra.job_id, run_id=ra.run_id, fault=f)
                                     for ra in runs)
        await self._send_pending()
        return faults

    async def _send_pending(self) -> None:
        while self._pending:
            if not await self.publish(self._pending[0]):
                return  # NATS away: the next poll tries again
            self._pending.popleft()

    async def validate(self) -> NodeHealthReply:
        """Run the validator now; a pass puts a node a fault drained back, a failure drains it."""
        before = self.health.fault
        check = await run_check(steps_for(self.gpus, self.allreduce, self.check_step_s), self.check_step_s,
                                self.clock.time)
        self.health.checked(check)
        bus = f" (all-reduce: {check.bus_gbps:.2f} GB/s bus bandwidth)" if check.bus_gbps else ""
        if check.ok:
            log.info("health check passed in %.2fs%s", check.duration_s, bus)
        else:
            log.warning("health check failed in %.2fs: %s", check.duration_s, check.detail)
        if self.health.fault is not before:
            self.changed()
        message = (f"health check passed in {check.duration_s:.2f} s{bus}" if check.ok
                   else f"health check failed: {check.detail}{bus}")
        return self._reply(message)

    def _reply(self, message: str) -> NodeHealthReply:
        return NodeHealthReply(node=self.node, message=message, fault=self.health.fault, check=self.health.check)

    # ------------------------------------------------------------------ the operators' requests

    async def _on_request(self, msg) -> None:
        await _nats.answer(msg, self._dispatch, "health operation")

    async def _dispatch(self, subject: str, data: bytes) -> NodeHealthReply:
        node, user, verb = names.parse_agent_op_subject(subject)
        if node != self.node or verb != names.AGENT_OP_HEALTH:
            raise InvalidRequest(f"no operation {verb!r} on node {node!r} here")
        req = decode(data, NodeHealthRequest)
        if req.action == HEALTH_VALIDATE:
            log.info("operator %s asks for a health check", user)
            return await self.validate()
        if req.action == HEALTH_UNDRAIN:
            return self._undrain(user, req.force)
        if req.action in (HEALTH_FAULT, HEALTH_CLEAR):
            return await self._simulate(user, req)
        raise InvalidRequest(f"no health action {req.action!r} (fault, clear, validate or undrain)")

    def _undrain(self, user: str, force: bool) -> NodeHealthReply:
        fault = self.health.fault
        refusal = self.health.undrain(self.node, force)
        if refusal:
            raise InvalidRequest(refusal)
        if fault is None:
            return self._reply(f"node {self.node} was not drained by a fault")
        log.warning("operator %s puts this node back in service%s after: %s", user, " (forced)" if force else "",
                    fault.text())
        self.changed()
        forced = " (forced, without a passing check)" if force else ""
        return self._reply(f"node {self.node} back in service{forced}")

    async def _simulate(self, user: str, req: NodeHealthRequest) -> NodeHealthReply:
        gpus = self.gpus
        if not isinstance(gpus, SimulatedGpus):
            raise InvalidRequest(f"node {self.node} has real GPUs ({gpus.name}): faults are injected into simulated "
                                 "GPUs only")
        if req.action == HEALTH_CLEAR:
            gpus.clear()
            log.warning("operator %s cleared the injected GPU faults", user)
            return self._reply("injected faults cleared: the simulated GPUs are as new (the node stays drained "
                               "until a health check passes)")
        try:
            signal = Signal(req.signal)
        except ValueError:
            raise InvalidRequest(f"no GPU signal {req.signal!r} ({', '.join(s.value for s in Signal)})") from None
        if signal is Signal.XID and req.xid <= 0:
            raise InvalidRequest("an Xid fault needs its code (--xid N)")
        gpus.inject(GpuSignal(signal, req.gpu, xid=req.xid if signal is Signal.XID else 0))
        log.warning("operator %s injected %s on simulated GPU %d", user,
                    f"Xid {req.xid}" if signal is Signal.XID else signal.value, req.gpu)
        return self._reply("injected: the health watch reports it within one health interval")
