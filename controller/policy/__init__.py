"""The scheduling policy: one pure function from (jobs, nodes, now, config) to decisions.

It never touches NATS, clocks or files; the leader's executor applies what it returns, and the
trace simulator (:mod:`hfai.sim`) runs the very same function in virtual time.
docs/scheduling.md states the rules for users; in short, per node group:

1. Order: higher *effective* priority first (ABOVE_NORMAL counts as NORMAL once the job has run
   ``above_normal_s`` in total); within a priority, first-come-first-served by original submit
   time (a resumed job keeps its place), except that each time-slice turn a job had moves it
   ``turn_s`` later (round-robin with a bounded wait).
2. Quotas: a job starts only if its user's nodes at its (declared) priority in its group stay
   within the quota; otherwise it waits, saying so, and reserves nothing.
3. Gang: a job gets all its nodes at once (elastic jobs: at least ``min_nodes``) or waits;
   victims are whole jobs, never part of a gang (an elastic job may be shrunk, which is a whole
   restart at a smaller size).
4. A job that does not fit counts free nodes and nodes already being released (jobs in their
   interrupt window count as leaving and are never asked twice), then picks the victims that cost
   least: lowest priority first, most recently started first; never a job of the same user and
   priority. Preemption happens only if it frees enough nodes, so nobody is interrupted for
   nothing, and victims that turn out not to be needed are dropped again.
5. Time slicing: a running job of the same effective priority but another user that has held its
   nodes for at least ``slice_s`` may be suspended (it moves back in the round-robin). A job that
   just (re)started is never sliced, so it keeps its nodes for at least one slice.
6. Reservation and backfill: a blocked job that is waiting for nodes it has already claimed
   (being released) pins the free nodes; one that cannot claim enough yet lets jobs behind it use
   the free nodes if it could later preempt them (lower priority, or same priority and another
   user, i.e. at most one slice away), and its own user's equal-priority jobs only until it has
   waited ``own_backfill_s``, so backfill never starves the head of the line.
7. Elastic jobs (``min_nodes..max_nodes``) start with what is left after every waiting job was
   served, grow into idle nodes when nothing waits (a ``Resize``: restart at a larger size), and
   are shrunk (a ``Resize`` to a smaller size) before whole jobs are taken as victims.
8. Nodes that are not schedulable (drained, down, GPU errors) get no work.

:data:`HFAI_GAIN` (:mod:`~hfai.controller.policy.gain`) keeps these rules and sizes elastic jobs
by the throughput their next node adds, fitted to what they were measured at
(:mod:`~hfai.controller.policy.speedup`).

Cost: O((W + R) log(W + R)) for W waiting and R running jobs, with per-priority totals so that a
waiting job never scans the running jobs just to learn it cannot preempt any.

Where each rule lives: :mod:`~hfai.controller.policy.views` (inputs, settings, decisions),
:mod:`~hfai.controller.policy.rules` (effective priority, service bands, quotas, the queue
order), :mod:`~hfai.controller.policy.victims` (the victim pool: rules 4, 5 and 7's shrinking),
:mod:`~hfai.controller.policy.rounds` (one group's round: rules 2 to 8, and ``quiet_until``);
:mod:`~hfai.controller.policy.interface` says what a policy is to its callers.
"""

from hfai.controller.policy.gain import HFAI_GAIN
from hfai.controller.policy.interface import FunctionPolicy, Policy
from hfai.controller.policy.rounds import HFAI, QUIET_MARGIN_S, decide, quiet_until
from hfai.controller.policy.rules import effective_priority, indexed, ordering, quota_usage, resolve_auto, service_band
from hfai.controller.policy.views import (
    Decision,
    JobView,
    NodeView,
    PolicyConfig,
    Resize,
    Start,
    Suspend,
    Wait,
)
from hfai.protocol.quotas import ANY, Quotas

__all__ = [
    "ANY", "HFAI", "HFAI_GAIN", "QUIET_MARGIN_S", "Decision", "FunctionPolicy", "JobView", "NodeView", "Policy",
    "PolicyConfig", "Quotas", "Resize", "Start", "Suspend", "Wait", "decide", "effective_priority", "indexed",
    "ordering", "quiet_until", "quota_usage", "resolve_auto", "service_band",
]
