"""Trace simulator: replay a job trace in virtual time through a scheduling policy.

The ``hfai`` policy is :func:`hfai.controller.policy.decide`, the very function the leader runs;
the simulator plays the executor (start, interrupt with a checkpoint, requeue, restart) and checks
the policy's decisions as it goes (a node given twice, a gang started on the wrong number of
nodes or a quota exceeded raise :class:`PolicyViolation`). Baselines with the same signature:
``fifo`` (strict first-come-first-served, no preemption, no backfill) and ``las`` (discretized
least-attained-service in the style of Tiresias: a few queues by attained node-time, FIFO within
a queue, preemptive).

Time model: the policy runs at most once per ``tick_s`` of virtual time (like the leader's
scheduling period) and only when something happened since its last run, or every ``wake_s`` while
jobs wait (time slices, priority decay and LAS demotions depend on the clock alone). An interrupt
costs ``checkpoint_s`` (the job holds its nodes but makes no progress) and ``restart_s`` at its
next start (holding nodes, no progress). Work is ``duration_s * nodes`` node-seconds (for an
elastic job ``duration_s`` is its run time at ``max_nodes``) and runs at one node-second per node
per second, so an elastic job at half size takes twice as long.

Trace format (CSV, optional header line, ``#`` comments)::

    submit_s,duration_s,nodes,priority,user
    0,3600,8,NORMAL,alice
    12.5,60,2:16,,bob

``nodes`` is ``N`` or ``MIN:MAX`` (elastic); ``priority`` is a level name or a number (default
NORMAL); ``user`` defaults to ``user``. See docs/scheduling.md.
"""

from __future__ import annotations

import bisect
import csv
import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from hfai.controller.policy import (
    Decision,
    JobView,
    NodeView,
    PolicyConfig,
    Start,
    Suspend,
    Wait,
    decide,
)
from hfai.protocol.errors import HfaiError, InvalidRequest
from hfai.protocol.types import ChainState, Priority

Policy = Callable[[list[JobView], list[NodeView], float, PolicyConfig], list[Decision]]


class TraceError(InvalidRequest):
    """A trace file that cannot be read: missing, or a row that is not a job."""


class PolicyViolation(HfaiError):
    """A policy returned a decision the cluster cannot carry out (a bug in the policy)."""


# ------------------------------------------------------------------------------------- trace


@dataclass(frozen=True)
class TraceJob:
    submit_s: float
    duration_s: float
    nodes: int
    priority: int = Priority.NORMAL.value
    user: str = "user"
    max_nodes: int = 0  # > nodes: elastic, nodes is then the minimum

    @property
    def hi(self) -> int:
        return max(self.max_nodes, self.nodes)


TRACE_COLUMNS = ("submit_s", "duration_s", "nodes", "priority", "user")


def parse_nodes(text: str) -> tuple[int, int]:
    """``"4"`` -> (4, 0); ``"2:8"`` -> (2, 8). Raises ValueError."""
    lo, sep, hi = text.strip().partition(":")
    n_lo = int(lo)
    n_hi = int(hi) if sep else 0
    if n_lo < 1 or (sep and n_hi < n_lo):
        raise ValueError(f"nodes must be N >= 1 or MIN:MAX with MAX >= MIN, got {text!r}")
    return n_lo, n_hi


def parse_row(row: Sequence[str]) -> TraceJob:
    """One CSV row to a job; raises ValueError (or InvalidRequest for a priority) saying why."""
    cells = [c.strip() for c in row]
    if len(cells) < 3 or len(cells) > 5:
        raise ValueError(f"expected 3 to 5 columns ({','.join(TRACE_COLUMNS)}), got {len(cells)}")
    submit, duration = float(cells[0]), float(cells[1])
    if not (math.isfinite(submit) and math.isfinite(duration)) or submit < 0 or duration <= 0:
        raise ValueError("submit_s must be >= 0 and duration_s > 0")
    lo, hi = parse_nodes(cells[2])
    prio = Priority.parse(cells[3]) if len(cells) > 3 and cells[3] else Priority.NORMAL.value
    user = cells[4] if len(cells) > 4 and cells[4] else "user"
    return TraceJob(submit, duration, lo, prio, user, hi)


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
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(TRACE_COLUMNS)
        for j in jobs:
            nodes = f"{j.nodes}:{j.max_nodes}" if j.max_nodes > j.nodes else str(j.nodes)
            w.writerow([f"{j.submit_s:.3f}", f"{j.duration_s:.3f}", nodes, Priority.label(j.priority), j.user])


# ---------------------------------------------------------------------------------- baselines


def fifo_decide(jobs: Iterable[JobView], nodes: Iterable[NodeView], now: float, config: PolicyConfig) -> list[Decision]:
    """Strict FIFO by submit time, no preemption, no backfill: the head of the line blocks."""
    jobs = list(jobs)
    free_by_group = _free_nodes(jobs, nodes)
    out: list[Decision] = []
    for group, free in sorted(free_by_group.items()):
        waiting = sorted((j for j in jobs if j.group == group and j.state.waiting), key=lambda j: (j.submit_ts, j.id))
        fi = 0
        for job in waiting:
            if job.lo > len(free) - fi:
                break
            out.append(Start(job.id, tuple(free[fi:fi + job.lo]), "fifo: head of the line fits"))
            fi += job.lo
    return out


def make_las(thresholds_node_s: Sequence[float] = (3600.0, 8 * 3600.0, 64 * 3600.0)) -> Policy:
    """A discretized least-attained-service policy (Tiresias-style): queue k holds jobs whose
    attained service (node-seconds run) is below ``thresholds_node_s[k]``; lower queues first, FIFO
    within a queue; every round the jobs that fit in that order (skipping those that do not) should
    run, and running jobs outside that set are suspended."""
    limits = sorted(thresholds_node_s)

    def las_decide(jobs: Iterable[JobView], nodes: Iterable[NodeView], now: float,
                   config: PolicyConfig) -> list[Decision]:
        jobs = list(jobs)
        free_by_group = _free_nodes(jobs, nodes)
        usable = _usable_by_group(nodes)
        out: list[Decision] = []
        for group in sorted(free_by_group):
            out.extend(_las_group([j for j in jobs if j.group == group], free_by_group[group],
                                  usable.get(group, 0), now, limits))
        return out

    las_decide.__name__ = "las_decide"
    return las_decide


def _las_group(jobs: list[JobView], free: list[str], usable: int, now: float, limits: list[float]) -> list[Decision]:
    def queue(j: JobView) -> int:
        ran = j.run_s + (now - j.started_ts if j.state.holds_nodes else 0.0)
        return bisect.bisect_right(limits, ran * j.size)

    # Nodes of jobs being suspended count as capacity: they are free once the checkpoint is done.
    cap = usable
    contenders = sorted((j for j in jobs if j.state is ChainState.RUNNING or j.state.waiting),
                        key=lambda j: (queue(j), j.submit_ts, j.id))
    out: list[Decision] = []
    fi = 0
    for j in contenders:
        size = j.size if j.state is ChainState.RUNNING else j.lo
        fits = size <= cap
        if fits:
            cap -= size
        if j.state is ChainState.RUNNING:
            if not fits:
                out.append(Suspend(j.id, f"las: queue {queue(j)} yields to jobs with less attained service",
                                   for_job=""))
        elif fits and size <= len(free) - fi:
            out.append(Start(j.id, tuple(free[fi:fi + size]), f"las: queue {queue(j)}"))
            fi += size
    return out


las_decide = make_las()


def _usable_by_group(nodes: Iterable[NodeView]) -> dict[str, int]:
    usable: dict[str, int] = {}
    for n in nodes:
        if n.schedulable:
            usable[n.group] = usable.get(n.group, 0) + 1
    return usable


def _free_nodes(jobs: list[JobView], nodes: Iterable[NodeView]) -> dict[str, list[str]]:
    busy = {n for j in jobs if j.state.holds_nodes for n in j.held}
    free: dict[str, list[str]] = {}
    for n in nodes:
        free.setdefault(n.group, [])
        if n.schedulable and n.name not in busy:
            free[n.group].append(n.name)
    for names in free.values():
        names.sort()
    return free


POLICIES: dict[str, Policy] = {"hfai": decide, "fifo": fifo_decide, "las": las_decide}


# ---------------------------------------------------------------------------------- simulator


@dataclass(frozen=True)
class SimConfig:
    checkpoint_s: float = 60.0
    restart_s: float = 60.0
    tick_s: float = 30.0
    wake_s: float = 300.0
    policy: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass
class _Job:
    """A job's life in the simulator (the executor's record)."""

    id: str
    trace: TraceJob
    state: ChainState = ChainState.QUEUED
    held: tuple[str, ...] = ()
    started_ts: float = 0.0
    progress_from: float = 0.0  # after the restart cost of this run
    slice_turns: int = 0
    run_s: float = 0.0
    work_left: float = 0.0  # node-seconds
    first_start: float = -1.0
    end: float = -1.0
    interrupts: int = 0
    queued_ts: float = 0.0
    gen: int = 0  # bumps on every start/suspend, so stale heap events are recognised

    def make_view(self) -> JobView:
        t = self.trace
        elastic = t.max_nodes > t.nodes
        return JobView(
            id=self.id, user=t.user, priority=t.priority, nodes=t.hi, submit_ts=t.submit_s, state=self.state,
            held=self.held, started_ts=self.started_ts, slice_turns=self.slice_turns, run_s=self.run_s,
            queued_ts=self.queued_ts,
            min_nodes=t.nodes if elastic else 0, max_nodes=t.max_nodes if elastic else 0,
        )


@dataclass(frozen=True)
class Sample:
    t: float
    busy: int
    queued: int


@dataclass
class SimResult:
    policy: str
    nodes: int
    jobs: int
    makespan_s: float
    utilisation: float  # busy node-time / capacity, over the time some job waited
    overhead: float  # node-time spent checkpointing and restarting / busy node-time
    avg_jct_s: float
    median_jct_s: float
    p99_jct_s: float
    avg_queue_s: float  # submit to first start
    interrupts_per_job: float
    fairness: float  # Jain's index over users of (their run time / their JCT)
    decisions: int  # policy calls
    samples: list[Sample] = field(default_factory=list)


_ARRIVE, _FINISH, _RELEASE = 0, 1, 2


class Simulator:
    """One replay. ``run()`` returns the metrics; the checks on the policy happen as it goes."""

    def __init__(self, trace: Sequence[TraceJob], n_nodes: int, policy: Policy, config: SimConfig,
                 name: str = "", record: bool = False):
        if n_nodes < 1:
            raise InvalidRequest("the simulated cluster needs at least one node")
        too_big = next((t for t in trace if t.nodes > n_nodes), None)
        if too_big is not None:
            raise InvalidRequest(f"a trace job needs {too_big.nodes} nodes, the simulated cluster has {n_nodes}")
        # Wait reasons are for people; the replay needs only what changes.
        self.policy_config = replace(config.policy, explain_waits=False)
        self.policy, self.config, self.name, self.record = policy, config, name, record
        self.n = n_nodes
        self.nodes = [NodeView(f"n{i:05d}") for i in range(n_nodes)]
        self.jobs = [_Job(f"j{i:07d}", t, work_left=t.duration_s * t.hi) for i, t in enumerate(trace)]
        self.active: dict[str, _Job] = {}
        self.views: dict[str, JobView] = {}  # of the active jobs, kept current
        self.owner: dict[str, str] = {}
        self.used: dict[tuple[str, int, str], int] = {}
        self.events: list[tuple[float, int, int, int, int]] = []  # (t, seq, kind, job index, gen)
        self.seq = 0
        self.now = 0.0
        self.busy = 0
        self.waiting = 0
        self.util_busy = self.util_cap = self.overhead_node_s = self.busy_node_s = 0.0
        self.calls = 0
        self.samples: list[Sample] = []
        self.index = {j.id: i for i, j in enumerate(self.jobs)}
        for i, j in enumerate(self.jobs):
            self.push(j.trace.submit_s, _ARRIVE, i, 0)

    def push(self, t: float, kind: int, i: int, gen: int) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, i, gen))

    # -- the clock

    def advance(self, t: float) -> None:
        """Integrate the metrics up to ``t``."""
        dt = t - self.now
        if dt > 0:
            self.busy_node_s += self.busy * dt
            if self.waiting:
                self.util_busy += self.busy * dt
                self.util_cap += self.n * dt
            self.now = t

    def run(self) -> SimResult:
        last_call = -math.inf
        while self.events or self.waiting:
            changed = False
            due = self.events[0][0] if self.events else math.inf
            # The policy runs on the scheduling grid: at the first tick at or after the next event,
            # or at the next wake-up while jobs wait, whichever is first.
            t_event = self.grid(due)
            t_wake = last_call + self.config.wake_s if self.waiting else math.inf
            t = max(min(t_event, t_wake), self.now)
            while self.events and self.events[0][0] <= t:
                ev_t, _, kind, i, gen = heapq.heappop(self.events)
                self.advance(ev_t)
                changed |= self.apply_event(kind, self.jobs[i], gen)
            self.advance(t)
            if changed or t >= t_wake:
                self.call_policy()
                last_call = t
                if not self.events and self.waiting:
                    # Nothing runs and nothing will arrive: no later call can differ from this one.
                    raise PolicyViolation(f"{self.name}: {self.waiting} job(s) wait on an idle cluster at "
                                          f"t={t:.0f}s and the policy starts none")
        return self.result()

    def grid(self, t: float) -> float:
        """The first scheduling tick at or after ``t``."""
        if t == math.inf:
            return t
        tick = self.config.tick_s
        at = math.ceil(t / tick) * tick
        return at if at >= t else at + tick  # t/tick can round down to a tick before t

    # -- events

    def apply_event(self, kind: int, job: _Job, gen: int) -> bool:
        if kind == _ARRIVE:
            self.active[job.id] = job
            self.waiting += 1
            self.views[job.id] = job.make_view()
            return True
        if gen != job.gen:
            return False  # superseded by a later start or suspend
        if kind == _FINISH:
            self.finish(job)
        else:
            self.release(job)
        return True

    def finish(self, job: _Job) -> None:
        job.work_left = 0.0
        job.run_s += self.now - job.started_ts
        job.end = self.now
        self.free(job)
        job.state = ChainState.SUCCEEDED
        del self.active[job.id]
        del self.views[job.id]

    def release(self, job: _Job) -> None:
        """The checkpoint is written: the nodes are free and the job is back in line."""
        self.free(job)
        job.state = ChainState.SUSPENDED
        job.queued_ts = self.now
        self.views[job.id] = job.make_view()
        self.waiting += 1

    def free(self, job: _Job) -> None:
        for n in job.held:
            del self.owner[n]
        self.busy -= len(job.held)
        key = (job.trace.user, job.trace.priority, "default")
        self.used[key] -= len(job.held)
        job.held = ()

    # -- decisions

    def call_policy(self) -> None:
        self.calls += 1
        views = list(self.views.values())
        for d in self.policy(views, self.nodes, self.now, self.policy_config):
            if isinstance(d, Start):
                self.start(self.active_job(d.job_id), d)
            elif isinstance(d, Suspend):
                self.suspend(self.active_job(d.job_id), d)
            elif not isinstance(d, Wait):
                raise PolicyViolation(f"{self.name}: unknown decision {d!r}")
        if self.record:
            self.samples.append(Sample(self.now, self.busy, self.waiting))

    def active_job(self, job_id: str) -> _Job:
        job = self.active.get(job_id)
        if job is None:
            raise PolicyViolation(f"{self.name}: decision for unknown or finished job {job_id}")
        return job

    def start(self, job: _Job, d: Start) -> None:
        t = job.trace
        if not job.state.waiting:
            raise PolicyViolation(f"{self.name}: start of {job.id}, which is {job.state.value}")
        if not t.nodes <= len(d.nodes) <= t.hi or len(set(d.nodes)) != len(d.nodes):
            raise PolicyViolation(f"{self.name}: {job.id} started on {len(d.nodes)} node(s), needs {t.nodes}..{t.hi}")
        for n in d.nodes:
            if n in self.owner:
                raise PolicyViolation(f"{self.name}: node {n} given to {job.id} while {self.owner[n]} holds it")
        key = (t.user, t.priority, "default")
        self.used[key] = self.used.get(key, 0) + len(d.nodes)
        limit = self.config.policy.quotas.limit(*key)
        if self.policy is decide and limit is not None and self.used[key] > limit:
            raise PolicyViolation(f"{self.name}: {job.id} exceeds the quota of {key}: {self.used[key]} > {limit}")
        for n in d.nodes:
            self.owner[n] = job.id
        restart = self.config.restart_s if job.first_start >= 0 else 0.0
        if job.first_start < 0:
            job.first_start = self.now
        job.state, job.held, job.started_ts = ChainState.RUNNING, d.nodes, self.now
        job.progress_from = self.now + restart
        job.gen += 1
        self.busy += len(d.nodes)
        self.waiting -= 1
        self.overhead_node_s += restart * len(d.nodes)
        self.push(job.progress_from + job.work_left / len(d.nodes), _FINISH, self.index[job.id], job.gen)
        self.views[job.id] = job.make_view()

    def suspend(self, job: _Job, d: Suspend) -> None:
        if job.state is not ChainState.RUNNING:
            return  # like transitions.apply_suspend: only a running job can be suspended
        done = max(0.0, self.now - job.progress_from) * len(job.held)
        job.work_left = max(job.work_left - done, 1e-6)
        job.run_s += self.now - job.started_ts
        job.interrupts += 1
        if d.sliced:
            job.slice_turns += 1
        job.state = ChainState.SUSPENDING
        job.gen += 1
        self.overhead_node_s += self.config.checkpoint_s * len(job.held)
        self.push(self.now + self.config.checkpoint_s, _RELEASE, self.index[job.id], job.gen)
        self.views[job.id] = job.make_view()

    # -- metrics

    def result(self) -> SimResult:
        jct = sorted(j.end - j.trace.submit_s for j in self.jobs)
        n = len(jct)
        per_user: dict[str, list[float]] = {}
        for j in self.jobs:
            ran, total = per_user.setdefault(j.trace.user, [0.0, 0.0])
            per_user[j.trace.user] = [ran + j.trace.duration_s, total + j.end - j.trace.submit_s]
        shares = [ran / total for ran, total in per_user.values() if total > 0]
        return SimResult(
            policy=self.name, nodes=self.n, jobs=n, makespan_s=self.now,
            utilisation=self.util_busy / self.util_cap if self.util_cap else 1.0,
            overhead=self.overhead_node_s / self.busy_node_s if self.busy_node_s else 0.0,
            avg_jct_s=sum(jct) / n, median_jct_s=_quantile(jct, 0.5), p99_jct_s=_quantile(jct, 0.99),
            avg_queue_s=sum(j.first_start - j.trace.submit_s for j in self.jobs) / n,
            interrupts_per_job=sum(j.interrupts for j in self.jobs) / n,
            fairness=jain(shares), decisions=self.calls, samples=self.samples,
        )


def _quantile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of an already sorted list."""
    k = max(0, min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1))
    return sorted_values[k]


def jain(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all equal, 1/n when one value has everything."""
    if not values:
        return 1.0
    sq = sum(v * v for v in values)
    return (sum(values) ** 2) / (len(values) * sq) if sq else 1.0


def simulate(trace: Sequence[TraceJob], n_nodes: int, policy: str = "hfai", config: SimConfig | None = None,
             record: bool = False) -> SimResult:
    """Replay ``trace`` on ``n_nodes`` nodes with the named policy (see :data:`POLICIES`)."""
    if policy not in POLICIES:
        raise InvalidRequest(f"unknown policy {policy!r}: use one of {', '.join(POLICIES)}")
    return Simulator(trace, n_nodes, POLICIES[policy], config or SimConfig(), name=policy, record=record).run()


# ---------------------------------------------------------------------------------- reporting


def _dur(s: float) -> str:
    if s < 120:
        return f"{s:.0f}s"
    if s < 7200:
        return f"{s / 60:.1f}m"
    if s < 172800:
        return f"{s / 3600:.1f}h"
    return f"{s / 86400:.1f}d"


def format_table(results: Sequence[SimResult]) -> str:
    """One row per policy, fixed-width columns."""
    head = ("policy", "util", "ovh", "avg JCT", "med JCT", "p99 JCT", "avg queue", "intr/job", "fairness")
    rows = [head] + [
        (r.policy, f"{100 * r.utilisation:.1f}%", f"{100 * r.overhead:.1f}%", _dur(r.avg_jct_s), _dur(r.median_jct_s),
         _dur(r.p99_jct_s), _dur(r.avg_queue_s), f"{r.interrupts_per_job:.2f}", f"{r.fairness:.3f}")
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))

    return "\n".join(line(row) for row in rows)


def plot(results: Sequence[SimResult], out: str | Path) -> None:
    """Utilisation and queue length over time, one line per policy (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise HfaiError("--plot needs matplotlib, which is not installed: pip install matplotlib") from None
    fig, (ax_u, ax_q) = plt.subplots(2, 1, sharex=True, figsize=(10, 6))
    for r in results:
        days = [s.t / 86400 for s in r.samples]
        # Samples are taken at events; the value holds until the next one, hence steps.
        ax_u.step(days, [100 * s.busy / r.nodes for s in r.samples], where="post", label=r.policy, linewidth=0.8)
        ax_q.step(days, [s.queued for s in r.samples], where="post", label=r.policy, linewidth=0.8)
    ax_u.set_ylabel("busy nodes (%)")
    ax_q.set_ylabel("jobs waiting")
    ax_q.set_xlabel("time (days)")
    ax_u.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
