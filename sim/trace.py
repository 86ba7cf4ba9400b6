"""Job traces for the simulator: the CSV format, reading and writing.

Format (CSV, optional header line, ``#`` comments)::

    submit_s,duration_s,nodes,priority,user,speedup
    0,3600,8,NORMAL,alice
    12.5,60,2:16,,bob
    30,3600,1:4,NORMAL,carol,1 1.9 2.6 3.0

``nodes`` is ``N`` or ``MIN:MAX`` (elastic); ``priority`` is a level name or a number (default
NORMAL); ``user`` defaults to ``user``; ``speedup`` (optional) is the job's throughput on 1, 2, ...,
MAX nodes relative to one node, space-separated (empty: linear). See docs/scheduling.md.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hfai._atomic import write_atomic
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.types import Priority


class TraceError(InvalidRequest):
    """A trace file that cannot be read: missing, or a row that is not a job."""


# ------------------------------------------------------------------------------------- trace


@dataclass(frozen=True)
class TraceJob:
    submit_s: float
    duration_s: float
    nodes: int
    priority: int = Priority.NORMAL.value
    user: str = "user"
    max_nodes: int = 0  # > nodes: elastic, nodes is then the minimum
    #: Throughput on 1, 2, ..., hi nodes relative to one node; () = linear (n on n nodes).
    speedup: tuple[float, ...] = ()

    @property
    def hi(self) -> int:
        return max(self.max_nodes, self.nodes)

    def rate(self, n: int) -> float:
        """Progress per second on ``n`` nodes, in one-node-seconds of work."""
        return self.speedup[n - 1] if self.speedup else float(n)

    @property
    def work(self) -> float:
        """The job's work in one-node-seconds: ``duration_s`` at its largest size."""
        return self.duration_s * self.rate(self.hi)


TRACE_COLUMNS = ("submit_s", "duration_s", "nodes", "priority", "user", "speedup")


def parse_nodes(text: str) -> tuple[int, int]:
    """``"4"`` -> (4, 0); ``"2:8"`` -> (2, 8). Raises ValueError."""
    lo, sep, hi = text.strip().partition(":")
    n_lo = int(lo)
    n_hi = int(hi) if sep else 0
    if n_lo < 1 or (sep and n_hi < n_lo):
        raise ValueError(f"nodes must be N >= 1 or MIN:MAX with MAX >= MIN, got {text!r}")
    return n_lo, n_hi


def parse_speedup(text: str, hi: int) -> tuple[float, ...]:
    """``"1 1.9 2.6 3.0"`` -> the curve (one value per size 1..hi, each > 0); ``""`` -> ()."""
    if not text.strip():
        return ()
    curve = tuple(float(x) for x in text.split())
    if len(curve) != hi:
        raise ValueError(f"speedup needs one value per size 1..{hi}, got {len(curve)}")
    if not all(math.isfinite(x) and x > 0 for x in curve):
        raise ValueError("speedup values must be > 0")
    return curve


def parse_row(row: Sequence[str]) -> TraceJob:
    """One CSV row to a job; raises ValueError (or InvalidRequest for a priority) saying why."""
    cells = [c.strip() for c in row]
    if len(cells) < 3 or len(cells) > 6:
        raise ValueError(f"expected 3 to 6 columns ({','.join(TRACE_COLUMNS)}), got {len(cells)}")
    submit, duration = float(cells[0]), float(cells[1])
    if not (math.isfinite(submit) and math.isfinite(duration)) or submit < 0 or duration <= 0:
        raise ValueError("submit_s must be >= 0 and duration_s > 0")
    lo, hi = parse_nodes(cells[2])
    prio = Priority.parse(cells[3]) if len(cells) > 3 and cells[3] else Priority.NORMAL.value
    user = cells[4] if len(cells) > 4 and cells[4] else "user"
    curve = parse_speedup(cells[5], max(lo, hi)) if len(cells) > 5 else ()
    return TraceJob(submit, duration, lo, prio, user, hi, curve)


def read_trace(path: str | Path) -> list[TraceJob]:
    """All jobs of a trace CSV, sorted by submit time. Raises TraceError naming file and line."""
    try:
        with open(path, newline="") as f:
            rows = list(enumerate(csv.reader(f), 1))
    except OSError as e:
        raise TraceError(f"cannot read trace {path}: {e.strerror or e}") from e
    except (csv.Error, UnicodeDecodeError) as e:
        raise TraceError(f"{path}: not a CSV file: {e}") from e
    jobs: list[TraceJob] = []
    for line, row in rows:
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        if not jobs and row[0].strip() == "submit_s":
            continue  # header
        try:
            jobs.append(parse_row(row))
        except (ValueError, InvalidRequest) as e:
            raise TraceError(f"{path} line {line}: {e}") from None
    if not jobs:
        raise TraceError(f"{path}: no jobs in the trace")
    jobs.sort(key=lambda j: j.submit_s)
    return jobs


def write_trace(path: str | Path, jobs: Iterable[TraceJob]) -> None:
    """Write a trace CSV atomically (a crash leaves the old file or the whole new one)."""
    buf = io.StringIO(newline="")
    w = csv.writer(buf)
    w.writerow(TRACE_COLUMNS)
    for j in jobs:
        nodes = f"{j.nodes}:{j.max_nodes}" if j.max_nodes > j.nodes else str(j.nodes)
        curve = " ".join(f"{x:.6g}" for x in j.speedup)
        w.writerow([f"{j.submit_s:.3f}", f"{j.duration_s:.3f}", nodes, Priority.label(j.priority), j.user, curve])
    write_atomic(path, buf.getvalue())
