"""What a scheduling policy is to its callers (the leader's planner, the simulator, the start-time
estimate): a :class:`Policy`. hfai's own (:data:`hfai.controller.policy.HFAI`) and the simulator's
baselines (:mod:`hfai.sim.baselines`: fifo, las, las-prio) implement it."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from hfai.controller.policy.views import Decision, JobView, NodeView, PolicyConfig
from hfai.controller.queues import JobIndex, Ordering

DecideFn = Callable[[Iterable[JobView] | JobIndex, Iterable[NodeView], float, PolicyConfig], list[Decision]]
OrderingFn = Callable[[PolicyConfig], Ordering]
QuietFn = Callable[[JobIndex, float, PolicyConfig], float]


class Policy(Protocol):
    """A pure scheduling policy: no NATS, no clock, no files; the same inputs give the same
    decisions (a baseline may keep memos that depend on its inputs alone)."""

    @property
    def name(self) -> str:
        """What the simulator and its tables call it."""
        ...

    def decide(self, jobs: Iterable[JobView] | JobIndex, nodes: Iterable[NodeView], now: float,
               config: PolicyConfig) -> list[Decision]:
        """All decisions for this moment: starts, suspensions (and resizes), and wait reasons.
        ``jobs`` is the live jobs or a :class:`~hfai.controller.queues.JobIndex` of them in
        :meth:`ordering`'s order, kept between rounds (a round then costs what it touches)."""
        ...

    def ordering(self, config: PolicyConfig) -> Ordering:
        """How the waiting jobs are lined up in the index that :meth:`decide` is given."""
        ...

    def quiet_until(self, jobs: JobIndex, now: float, config: PolicyConfig) -> float:
        """The earliest time after ``now`` at which :meth:`decide` could decide otherwise with the
        same jobs and nodes (math.inf: never by the clock alone). The simulator skips the
        periodic rounds before it after a round that changed nothing."""
        ...


@dataclass(frozen=True)
class FunctionPolicy:
    """A :class:`Policy` made of three functions (how every policy here is written)."""

    name: str
    decide: DecideFn
    ordering: OrderingFn
    quiet_until: QuietFn
