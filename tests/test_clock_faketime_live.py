"""Issue 38 §3, live: the agent on the system clock, its wall clock stepped by libfaketime while a
real job is being interrupted (DONT_FAKE_MONOTONIC=1: the monotonic and boot clocks run true, as
when NTP or an operator steps a host's clock). The agent runs in a process of its own, preloaded
with libfaketime, whose offset the test changes through FAKETIME_TIMESTAMP_FILE; its launchers and
jobs are started without the preload (a job under libfaketime gets EINVAL from time.sleep).
Needs the Debian package ``faketime`` (.ci/run installs it)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

#: A bound on the whole scenario on two shared cores, not a timing.
WAIT_S = 60.0

# The agent's side: argv = state dir, scenario, offset file. Prints one JSON line.
AGENT = r'''
import asyncio, json, os, sys, time
from pathlib import Path
from types import SimpleNamespace

# libfaketime is loaded in this process; its children (launchers, jobs) must not load it.
os.environ.pop("LD_PRELOAD", None)

from hfai._job import ACK_FILE, SUSPEND_FILE
from hfai.agent import stamps
from hfai.agent.service import Agent
from hfai.core.config import AgentConfig, Config
from hfai.protocol import encode
from hfai.protocol.types import DesiredRun, NodeAssignment, RunAssignment, RunEventKind

state, scenario, offset_file = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
ACK_WINDOW_S, GRACE_S = 3.0, 4.0
up = state.parent / "up"
STUBBORN = ("import pathlib, signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "pathlib.Path(sys.argv[1]).write_text('up'); time.sleep(600)")


def assign(agent, desired, fence):
    ra = RunAssignment(job_id="stubborn", run_id=1, name="stubborn", user="u", group="default", priority=10,
                       rank=0, world_size=1, master_addr="127.0.0.1", master_port=20000,
                       entrypoint=(sys.executable, "-c", STUBBORN, str(up)), workdir=str(state.parent),
                       desired=desired, ack_window_s=ACK_WINDOW_S, kill_window_s=60.0)
    agent.assignment.on_assignment(SimpleNamespace(value=encode(NodeAssignment(node="n0", fence=fence, runs=(ra,))),
                                         operation=None))


async def until(done):
    while not done():
        await asyncio.sleep(0.02)


async def main():
    cfg = AgentConfig(node="n0", state_dir=str(state), env_root=str(state.parent / "envs"), gpu_source="sim",
                      run_as="agent", launcher="exec", reconcile_interval_s=0.2, ack_exit_grace_s=GRACE_S)
    agent = Agent(Config(agent=cfg))
    sent = []

    async def publish(ra, kind, **fields):
        sent.append(kind)
        return True

    agent.reports.publish = publish
    key = "stubborn.1"
    assign(agent, DesiredRun.RUN, 1)
    loop = asyncio.create_task(agent.reconciler.loop())
    await until(up.exists)
    assign(agent, DesiredRun.SUSPEND, 2)
    flag, term = agent.store.control_dir(key) / SUSPEND_FILE, agent.store.dir(key) / "term"
    await until(flag.exists)
    out = {}
    if scenario == "back":  # the job never acknowledges; the clock goes back 300 s
        wall = time.time()
        offset_file.write_text("-300s\n")
        out["stepped"] = time.time() - wall
    else:  # the job acknowledges; 1 s into its exit grace the clock goes forward 120 s
        out["acked"] = time.monotonic()  # before the agent can see the ack: its grace ends later
        (flag.parent / ACK_FILE).write_text(f"{os.getpid()} {time.time()} exit\n")
        await until(lambda: RunEventKind.SUSPEND_ACKED in sent)
        await asyncio.sleep(1.0)
        wall = time.time()
        offset_file.write_text("+120s\n")
        out["stepped"] = time.time() - wall
    await until(term.exists)
    out["term_seen"] = time.monotonic()
    if scenario == "back":  # the window as the agent stamped it, on its boot clock
        read = lambda name: stamps.parse((agent.store.dir(key) / name).read_text())[1]
        out["window"] = read("term") - read(stamps.SUSPEND_STAMP)
    loop.cancel()
    await asyncio.gather(loop, return_exceptions=True)
    agent.store.signal(key, 9)
    print(json.dumps(out), flush=True)


asyncio.run(main())
'''


def _libfaketime() -> str:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1") + glob.glob("/usr/lib/faketime/libfaketime.so.1"))
    assert found, "libfaketime is missing: apt-get install faketime (.ci/run does)"
    return found[0]


def _run(tmp_path: Path, scenario: str) -> dict:
    script, offset = tmp_path / "agent.py", tmp_path / "faketime"
    script.write_text(AGENT)
    offset.write_text("+0\n")
    env = {**os.environ, "LD_PRELOAD": _libfaketime(), "FAKETIME_TIMESTAMP_FILE": str(offset),
           "FAKETIME_NO_CACHE": "1", "DONT_FAKE_MONOTONIC": "1"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "state"), scenario, str(offset)], env=env,
                          capture_output=True, text=True, timeout=WAIT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_wall_clock_stepped_back_300s_does_not_hold_off_the_sigterm(tmp_path):
    """The SIGTERM comes ack_window_s (3 s) after the flag, not 303 s (past the test's bound,
    which is what an agent on the wall clock met)."""
    out = _run(tmp_path, "back")
    assert out["stepped"] < -250, out  # libfaketime did step this agent's wall clock
    assert out["window"] >= 3.0, out


def test_a_wall_clock_stepped_forward_120s_does_not_cut_the_exit_grace_short(tmp_path):
    """The job acknowledged; 1 s into its 4 s grace the clock jumps 120 s: the SIGTERM still waits
    for the grace to end on the boot clock."""
    out = _run(tmp_path, "forward")
    assert out["stepped"] > 110, out
    assert out["term_seen"] - out["acked"] >= 4.0, out
