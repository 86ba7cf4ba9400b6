"""Many simulated nodes in one process: ``python -m hfai.agent.fleet --nodes 500 --first 0``.

For scale tests and benchmarks (``bench/bench_scale.py``), where one process per node would spend
the machine on interpreters. Each node is a real :class:`hfai.agent.service.Agent` with its own
node name, state directory, credentials file and NATS connection, and simulated GPUs; they share
one event loop. So each heartbeats, watches its assignment, starts its runs through the launcher,
reports events and serves its logs exactly as a lone agent would, with that node's permissions
(a fleet can do nothing a node could not).

Node ``i`` is ``<prefix><i>``; its state lives in ``<state_root>/<node>`` and its credentials in
``<creds_dir>/<node>.creds`` (the layout of ``hfai local``: ``$HFAI_HOME/local/agents`` and
``$HFAI_HOME/local/auth/creds``, the defaults). The fleet presents credentials, it never issues
them: issue them first (``hfai admin user add node-7 --role agent -o DIR/node-7.creds``, or
``LocalCluster.service_creds``).

Everything else is the ``[agent]`` configuration, shared by the fleet. Heartbeats are KV writes:
with 1,000 nodes, keep ``heartbeat_interval_s`` at a few seconds (and ``heartbeat_timeout_s`` at
five of them or more), and raise ``reconcile_interval_s``: a change of assignment and a launcher's
exit wake an agent at once, the periodic tick only catches what those missed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextvars
import dataclasses
import logging
import os
import subprocess
import sys
from pathlib import Path

from hfai.core.clock import SYSTEM, Clock
from hfai.core.config import Config, hfai_home
from hfai.core.daemon import SHUTDOWN_TIMEOUT_S, serve, setup_logging
from hfai.protocol import names

log = logging.getLogger(__name__)

#: Agents connecting at the same time while a fleet starts: all at once, a thousand connections
#: and their JetStream look-ups time out against a busy server.
START_CONCURRENCY = 16
#: Where the node names of a fleet begin, as in ``hfai local``.
PREFIX = "node-"

#: The node whose agent is running: set in each agent's tasks (they inherit it from the task that
#: started the agent), so the log lines of a thousand agents in one file can be told apart.
current_node: contextvars.ContextVar[str] = contextvars.ContextVar("hfai_fleet_node", default="-")


class NodeLogFilter(logging.Filter):
    """Gives every log record a ``node`` attribute (:data:`current_node`) for the format to show."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.node = current_node.get()
        return True


def node_names(first: int, count: int, prefix: str = PREFIX) -> list[str]:
    """``count`` node names from ``<prefix><first>`` on; each must be a valid name."""
    if first < 0 or count < 0:
        raise ValueError(f"a fleet needs first >= 0 and count >= 0, not {first} and {count}")
    return [names.check_token("node name", f"{prefix}{i}") for i in range(first, first + count)]


def agent_config(base: Config, node: str, state_root: str | os.PathLike, creds_dir: str | os.PathLike | None) -> Config:
    """The configuration of one agent of the fleet (pure): ``base`` with this node's name, state
    directory and credentials (none when ``creds_dir`` is None: a server without authentication),
    the loopback address and simulated GPUs (NVML would show every node the same real GPUs)."""
    creds = str(Path(creds_dir) / f"{node}.creds") if creds_dir is not None else ""
    return dataclasses.replace(
        base,
        nats=dataclasses.replace(base.nats, creds=creds),
        agent=dataclasses.replace(base.agent, node=node, state_dir=str(Path(state_root) / node),
                                  address="127.0.0.1", gpu_source="sim"),
    )


class Fleet:
    """Agents of ``nodes`` on the running event loop. :meth:`start` starts them, at most
    ``start_concurrency`` at a time; :meth:`close` stops them all (their jobs keep running, as
    with a lone agent) and is safe to call twice. ``clock`` is every agent's, and times the starts."""

    def __init__(self, base: Config, nodes: list[str], state_root: str | os.PathLike,
                 creds_dir: str | os.PathLike | None, start_concurrency: int = START_CONCURRENCY,
                 clock: Clock = SYSTEM):
        from hfai.agent.service import Agent

        if start_concurrency < 1:
            raise ValueError(f"start_concurrency must be at least 1, not {start_concurrency}")
        self.clock = clock
        self.agents = [Agent(agent_config(base, n, state_root, creds_dir), clock=clock) for n in nodes]
        self._start_concurrency = start_concurrency
        self._closed = False
        # serve() gives close() this long; agents close concurrently, so one agent's bound will do.
        self.shutdown_timeout_s = SHUTDOWN_TIMEOUT_S

    async def start(self) -> None:
        """Start every agent; if one cannot start, stop those started and raise its error.

        Starts are spread over at least one heartbeat interval, so the agents' heartbeats are
        spread over it too, as those of nodes that booted at different times would be, rather
        than arriving in one burst per interval."""
        gate = asyncio.Semaphore(self._start_concurrency)
        clock = self.clock
        t0, n = clock.monotonic(), max(1, len(self.agents))

        async def start_one(i: int, agent) -> None:
            await clock.sleep(max(0.0, t0 + i * agent.ac.heartbeat_interval_s / n - clock.monotonic()))
            async with gate:
                current_node.set(agent.node)  # this task's own context: its agent's tasks inherit it
                await agent.start()

        results = await asyncio.gather(*(start_one(i, a) for i, a in enumerate(self.agents)), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await self.close()
            raise errors[0]
        log.info("fleet of %d agents up (%s .. %s)", len(self.agents),
                 self.agents[0].node if self.agents else "-", self.agents[-1].node if self.agents else "-")

    async def failed(self) -> str:
        """Returns, naming the node, once one agent failed (its :meth:`Agent.failed`): the fleet
        process then exits non-zero, as that agent's own process would. One process cannot
        restart one agent, so the fleet stops whole rather than go on with a dead node."""
        waits = {asyncio.create_task(a.failed()): a for a in self.agents}
        try:
            if not waits:
                await asyncio.Event().wait()
            done, _ = await asyncio.wait(list(waits), return_when=asyncio.FIRST_COMPLETED)
            first = done.pop()
            return f"the agent of {waits[first].node} failed: {first.result()}"
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        async def close_one(agent) -> None:
            current_node.set(agent.node)
            await agent.close()

        # Every agent, started or not: one whose start failed half-way may hold a connection.
        results = await asyncio.gather(*(close_one(a) for a in self.agents), return_exceptions=True)
        for agent, r in zip(self.agents, results, strict=True):
            if isinstance(r, BaseException):
                log.warning("agent %s did not close cleanly: %s", agent.node, r)


def fleet_argv(count: int, first: int = 0, state_root: str | os.PathLike | None = None,
               creds_dir: str | os.PathLike | None = None, prefix: str = PREFIX) -> list[str]:
    """The command line of a fleet process (for tests and benchmarks that start one)."""
    argv = [sys.executable, "-m", "hfai.agent.fleet", "--nodes", str(count), "--first", str(first), "--prefix", prefix]
    if state_root is not None:
        argv += ["--state-root", str(state_root)]
    if creds_dir is not None:
        argv += ["--creds-dir", str(creds_dir)]
    return argv


def spawn(config_path: str | os.PathLike, count: int, first: int, state_root: str | os.PathLike,
          creds_dir: str | os.PathLike, log_path: str | os.PathLike,
          env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start a fleet process reading ``config_path``, logging to ``log_path``, in a session of its
    own (like ``hfai local``'s daemons). Stop it with SIGTERM; it exits 0 once its agents closed."""
    full_env = {k: v for k, v in os.environ.items() if k != "HFAI_NATS_CREDS"}
    full_env.update(env or {}, HFAI_CONFIG=str(config_path))
    with open(log_path, "ab") as logf:
        return subprocess.Popen(fleet_argv(count, first, state_root, creds_dir), env=full_env, stdout=logf,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def main(argv: list[str] | None = None) -> int:
    local = hfai_home() / "local"
    p = argparse.ArgumentParser(prog="python -m hfai.agent.fleet", description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, required=True, help="how many agents this process hosts")
    p.add_argument("--first", type=int, default=0, help="number of the first node (default 0)")
    p.add_argument("--prefix", default=PREFIX, help=f"node names are PREFIX<number> (default {PREFIX})")
    p.add_argument("--state-root", default=str(local / "agents"), help="each node's state is STATE_ROOT/<node>")
    p.add_argument("--creds-dir", default=str(local / "auth" / "creds"),
                   help="each node's credentials are CREDS_DIR/<node>.creds; '' for a server without auth")
    p.add_argument("--start-concurrency", type=int, default=START_CONCURRENCY)
    p.add_argument("--config", help="TOML config file (default: $HFAI_CONFIG or /etc/hfai/hfai.toml)")
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    setup_logging(args.log_level)
    for handler in logging.getLogger().handlers:
        handler.addFilter(NodeLogFilter())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(node)s %(name)s: %(message)s"))
    from hfai.core.config import load_config
    from hfai.protocol.errors import HfaiError

    try:
        nodes = node_names(args.first, args.nodes, args.prefix)
        fleet = Fleet(load_config(args.config), nodes, args.state_root, args.creds_dir or None,
                      args.start_concurrency)
        return asyncio.run(serve(fleet.start, fleet.close, fleet.failed, fleet.shutdown_timeout_s))
    except (HfaiError, ValueError) as e:
        print(f"hfai fleet: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
