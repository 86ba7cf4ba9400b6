"""How ``hfai local down`` interrupts the jobs: it asks each node's agent to suspend every run
(the agent operation of hfai.agent.operations, with the invoking operator's credentials) and
waits for the agents to say their runs ended and were reported."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from hfai.api.client import ApiClient
from hfai.core.config import Config
from hfai.protocol import names
from hfai.protocol.errors import Unavailable
from hfai.protocol.types import NodeSuspendReply, NodeSuspendRequest


async def suspend(ops: ApiClient, node: str, req: NodeSuspendRequest) -> NodeSuspendReply:
    """Ask ``node``'s agent (an agent operation: an operator's client) to suspend every run; it
    answers within ``req.wait_s``, which the request waits for on top of the usual time."""
    return await ops.request(names.agent_op_subject(node, ops.user, names.AGENT_OP_SUSPEND), req, NodeSuspendReply,
                             timeout=req.wait_s + ops.config.nats.request_timeout_s)


@dataclass
class Interrupted:
    """What the agents said: the runs they interrupted, those still unsettled when the wait
    ended, and the nodes whose agent did not answer."""

    runs: int = 0
    unsettled: int = 0
    silent: tuple[str, ...] = ()


async def suspend_nodes(config: Config, user: str, nodes: list[str], ack_window_s: float, kill_window_s: float,
                        wait_s: float, announce: Callable[[int, float], object] | None = None) -> Interrupted:
    """Ask every node's agent to suspend its runs (at once, to learn how many), then wait for
    them all to settle. An agent that does not answer is reported silent; a refusal (Forbidden:
    not an operator) raises."""
    ops = ApiClient(config, user=user)
    async with ops:

        async def ask(node: str, wait: float) -> NodeSuspendReply | None:
            try:
                return await suspend(ops, node, NodeSuspendRequest(ack_window_s, kill_window_s, wait))
            except (Unavailable, OSError):
                return None  # a dead agent (no responders) or one that hangs

        first = dict(zip(nodes, await asyncio.gather(*(ask(node, 0.0) for node in nodes)), strict=True))
        live = [node for node, reply in first.items() if reply is not None]
        runs = sum(len(reply.interrupted) for reply in first.values() if reply is not None)
        if announce is not None and runs:
            announce(runs, ack_window_s)
        settled = dict(zip(live, await asyncio.gather(*(ask(node, wait_s) for node in live)), strict=True))
        done = [reply for reply in settled.values() if reply is not None]
        return Interrupted(runs=max(runs, sum(len(reply.interrupted) for reply in done)),
                           unsettled=sum(len(reply.unsettled) for reply in done),
                           silent=tuple(node for node in nodes if settled.get(node) is None))
