"""Issue 39 item 9: `hfai logs --timestamps` stamped every line of a finished job with the same
time, the time it was read by the client. The launcher now notes when it read each line
(hfai.agent.logtimes), the log's compaction keeps those times with the lines it keeps, the agent
answers with them, and render.LineStamper puts them before the lines. The same through a real
cluster: tests/test_rough_edges3_web_live.py."""

from __future__ import annotations

import os
import re
import time

from hfai.agent.logcap import CappedLog
from hfai.agent.logtimes import TimesWriter, line_starts, line_times, stamp_lines, times_path
from hfai.agent.output import open_output
from hfai.cli.render import LineStamper

T0 = 1_700_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def _open(path) -> tuple[int, int]:
    log = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    times = os.open(times_path(path), os.O_RDWR | os.O_CREAT, 0o600)
    return log, times


def _stamps(log_fd: int, times_fd: int, offset: int = 0) -> list[tuple[bytes, float]]:
    """Every line of the log from ``offset`` (a line's start) with the time the agent would send."""
    data = os.pread(log_fd, 1 << 24, offset)
    at_start = offset == 0 or os.pread(log_fd, 1, offset - 1) == b"\n"
    data, ts = line_times(times_fd, offset, data, at_start)
    lines = data.splitlines(keepends=True)
    assert len(lines) == len(ts), (lines, ts)
    return [(line.rstrip(b"\n"), t) for line, t in zip(lines, ts, strict=True)]


def test_each_line_keeps_the_time_it_was_read(tmp_path):
    log, times = _open(tmp_path / "rank0.log")
    os.write(log, b"=== the agent's header ===\n")
    clock = Clock()
    sink = CappedLog(log, 0, TimesWriter(times), clock)
    sink.write(b"one\ntw")  # a line read in two pieces keeps its first piece's time
    clock.now += 5
    sink.write(b"o\nthree\n")
    clock.now += 0.0004  # within a millisecond: the same time as the line before
    sink.write(b"four\n")
    clock.now += 60
    sink.write(b"five\n")
    assert _stamps(log, times) == [(b"=== the agent's header ===", T0), (b"one", T0), (b"two", T0),
                                   (b"three", T0 + 5), (b"four", T0 + 5), (b"five", T0 + 65.0004)]
    # From the middle of the log (hfai logs --tail, a follow): the same times.
    second = len(b"=== the agent's header ===\none\n")
    assert _stamps(log, times, second)[1:] == [(b"three", T0 + 5), (b"four", T0 + 5), (b"five", T0 + 65.0004)]


def test_a_compacted_log_keeps_the_times_of_the_lines_it_keeps(tmp_path):
    log, times = _open(tmp_path / "rank0.log")
    clock = Clock()
    cap = 64 * 1024
    sink = CappedLog(log, cap, TimesWriter(times), clock)
    for i in range(4000):  # ~4x the cap: compacted several times
        clock.now = T0 + i
        sink.write(f"line {i:05d} {'x' * 40}\n".encode())
    lines = _stamps(log, times)
    assert os.fstat(log).st_size <= cap + 4096
    marker = [k for k, (text, _) in enumerate(lines) if text.startswith(b"=== hfai:")]
    assert len(marker) == 1
    whole = [(text, ts) for text, ts in lines if re.fullmatch(rb"line \d{5} x{40}", text)]
    assert len(whole) >= len(lines) - 2  # the marker, and the head's last line the cut may split
    for text, ts in whole:
        assert ts == T0 + int(text.split()[1]), (text, ts)  # each kept line: its own time
    assert lines[-1][0].startswith(b"line 03999")
    # The times of the dropped lines went with them: a few records per kept line at most.
    assert os.fstat(times).st_size <= 16 * (len(lines) + 2)


def test_the_launchers_output_channel_writes_the_times(tmp_path):
    path = tmp_path / "rank0.log"
    path.write_bytes(b"")
    with open_output(str(path), 0) as out:
        os.write(out.job_fd, b"hello\n")
        out.job_started()
        out.drain(5.0)
    log, times = os.open(path, os.O_RDONLY), os.open(times_path(path), os.O_RDONLY)
    [(text, ts)] = _stamps(log, times)
    assert text == b"hello" and abs(ts - time.time()) < 3600  # a wall-clock time of today


def test_the_pure_parts():
    assert line_starts(b"a\nb\n", True) == [0, 2]
    assert line_starts(b"a\nb\n", False) == [2]
    assert line_starts(b"a\nb", False) == [2] and line_starts(b"", True) == []
    records = [(10, 1.0), (20, 2.0)]
    assert stamp_lines(records, [0, 10, 15, 20, 99]) == (1.0, 1.0, 1.0, 2.0, 2.0)
    assert stamp_lines([], [0, 5]) == (0.0, 0.0)  # no times kept (an older agent's log)
    assert line_times(None, 0, b"a\nb\n", True) == (b"a\nb\n", (0.0, 0.0))


def test_the_client_stamps_each_line_with_the_nodes_time():
    stamper = LineStamper()
    now = T0 + 3600
    out = (stamper.feed(b"one\ntw", now, (T0, T0 + 1)) + stamper.feed(b"o\nthree\n", now, (T0 + 2,)))
    out = out.decode().splitlines()
    assert [line.split(" ", 1)[1] for line in out] == ["one", "two", "three"]
    stamps = [line.split(" ", 1)[0] for line in out]
    assert stamps[0].endswith(time.strftime("%H:%M:%S", time.localtime(T0)) + ".000")
    assert stamps[1].endswith(time.strftime("%H:%M:%S", time.localtime(T0 + 1)) + ".000")
    assert stamps[2].endswith(time.strftime("%H:%M:%S", time.localtime(T0 + 2)) + ".000")
    # A log with no times (an older agent's): the time it was received, as before.
    old = LineStamper().feed(b"x\n", now, (0.0,)).decode()
    assert old.startswith(time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(now)))
