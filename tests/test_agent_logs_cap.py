"""A run's log on its node is bounded by [agent] log_cap_bytes (issue 26 §7: a job printing 1 GiB
left a 1.1 GB log): the head and the latest output are kept, with a line saying how many bytes
were dropped between; earlier runs' output in the same file is never touched. Real launchers,
real jobs, small caps."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from hfai.agent.launchers import LAUNCH_EXEC, ExecLauncher
from hfai.agent.logcap import MIN_CAP_BYTES, CappedLog
from hfai.agent.plan import RunPhase
from hfai.agent.runs import RunStore
from hfai.protocol.types import DesiredRun, LogRequest, RunAssignment

CAP = 256 * 1024
LINES = 1_500_000  # "line %08d\n": 21 MB of output, 80 times the cap

PRINTER = """
import sys
w = sys.stdout.buffer.write
for i in range(0, {n}, 10000):
    w(b"".join(b"line %08d\\n" % j for j in range(i, min(i + 10000, {n}))))
"""


def _ra(tmp_path: Path, code: str, run_id: int = 1) -> RunAssignment:
    return RunAssignment(job_id="j1", run_id=run_id, name="printer", user="u", group="default", priority=10, rank=0,
                         world_size=1, master_addr="127.0.0.1", master_port=20000,
                         entrypoint=(sys.executable, "-c", code), workdir=str(tmp_path), desired=DesiredRun.RUN)


def _run(store: RunStore, ra: RunAssignment) -> int | None:
    launched = store.start(ra)
    assert launched is not None
    launched.wait(120)
    run = store.snapshot()[ra.key]
    assert run.phase is RunPhase.EXITED
    return run.exit_code


def test_a_run_printing_far_past_the_cap_keeps_its_head_and_latest_output_and_says_what_was_dropped(tmp_path):
    store = RunStore(tmp_path / "state", "n0", tmp_path / "envs", run_as="agent", launcher=ExecLauncher(),
                     log_cap_bytes=CAP)
    earlier = b"an earlier run's last words\n" * 20_000  # 560 KB: more than the cap, never cut
    path = store.log_path("j1", 0)
    path.parent.mkdir(parents=True)
    path.write_bytes(earlier)

    assert _run(store, _ra(tmp_path, PRINTER.format(n=LINES), run_id=2)) == 0

    data = path.read_bytes()
    assert data.startswith(earlier)
    run = data[len(earlier):]
    header, _, run = run.partition(b"\n")
    assert header.startswith(b"=== hfai: job printer (j1) run 2")
    assert len(run) <= CAP + 1024  # the cap, the "dropped" line and the launcher's last line
    head, marker, tail = re.split(rb"\n?(=== hfai: \d+ bytes of this run's output dropped here[^\n]*)\n", run)
    dropped = int(marker.split()[2])
    total = LINES * 14
    lines = tail.decode().splitlines()
    assert lines[-1].startswith("=== hfai: process exited with code 0")
    kept = tail[: -len(lines[-1]) - 1]
    assert len(head) + dropped + len(kept) == total  # every byte is kept or counted
    assert head.startswith(b"line 00000000\nline 00000001\n") and len(head) == CAP // 4
    assert len(kept) >= CAP // 2 - 4096 and kept.endswith(b"line %08d\n" % (LINES - 1))
    assert re.fullmatch(rb"(line \d{8}\n)+", kept)  # whole lines: the tail starts at one
    first = int(kept[5:13])
    assert kept == b"".join(b"line %08d\n" % j for j in range(first, LINES))  # in order, nothing torn


def test_reading_a_capped_log_pages_through_a_bounded_file(tmp_path):
    """What `hfai logs` reads (the agent's read_log, paged) is the capped file: a few pages, not
    the 21 MB the job printed."""
    from hfai.agent.service import Agent
    from hfai.core.config import AgentConfig, Config

    agent = Agent(Config(agent=AgentConfig(node="n0", state_dir=str(tmp_path / "state"), env_root=str(tmp_path),
                                           gpu_source="sim", run_as="agent", launcher=LAUNCH_EXEC,
                                           log_cap_bytes=CAP)))
    assert _run(agent.store, _ra(tmp_path, PRINTER.format(n=LINES))) == 0
    chunk = agent.read_log(LogRequest(job_id="j1", rank=0, offset=0))
    assert chunk.size <= CAP + 2048


def test_a_cap_keeps_head_and_tail_whatever_the_write_sizes(tmp_path):
    """CappedLog alone, fed pieces of odd sizes: the file is always the earlier content, this
    run's first quarter of the cap, the "dropped" line, and a suffix of the output."""
    path = tmp_path / "log"
    path.write_bytes(b"before\n")
    fd = os.open(path, os.O_RDWR)
    sink = CappedLog(fd, MIN_CAP_BYTES)
    out = bytearray()
    for i in range(3000):
        piece = (f"{i:05d}:" + "z" * (i * 7919 % 313)).encode() + b"\n"
        sink.write(piece)
        out += piece
        if i % 500 == 499:
            data = path.read_bytes()
            assert data.startswith(b"before\n" + out[: MIN_CAP_BYTES // 4])
            assert len(data) - 7 <= MIN_CAP_BYTES
    os.close(fd)
    data = path.read_bytes()[7:]
    head, marker, tail = re.split(rb"\n?(=== hfai: \d+ bytes[^\n]*)\n", data)
    assert out.startswith(head) and out.endswith(tail) and len(tail) >= MIN_CAP_BYTES // 2 - 4096
    assert len(head) + int(marker.split()[2]) + len(tail) == len(out)


def test_a_cap_below_the_minimum_is_refused_with_what_to_set(tmp_path):
    with pytest.raises(ValueError, match=r"\[agent\] log_cap_bytes must be 0 \(no cap\) or at least 65536, not 1000"):
        RunStore(tmp_path / "state", "n0", tmp_path, run_as="agent", log_cap_bytes=1000)
