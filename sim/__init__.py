"""The trace simulator (``hfai sim``, bench/bench_sched.py): job traces replayed in virtual time
through the leader's own plan, under hfai's policy or a baseline, and the tables they make.

:mod:`~hfai.sim.replay` (the replay and the registry of policies), :mod:`~hfai.sim.baselines`
(fifo, las, las-prio), :mod:`~hfai.sim.trace` (the CSV trace format), :mod:`~hfai.sim.tracegen`
(synthetic traces), :mod:`~hfai.sim.report` (results, the table and the plot),
:mod:`~hfai.sim.oracle` (fluid bounds for traces with speedup curves, bench/bench_elastic.py). The controller
never imports this package: the simulator is a client of its plan, like the leader.
"""

from hfai.sim.baselines import FIFO, LAS, LAS_PRIO, make_las
from hfai.sim.replay import POLICIES, PolicyViolation, SimConfig, Simulator, simulate
from hfai.sim.report import Sample, SimResult, format_table, jain, plot, quantile
from hfai.sim.trace import TRACE_COLUMNS, TraceError, TraceJob, parse_nodes, parse_row, read_trace, write_trace

__all__ = [
    "FIFO", "LAS", "LAS_PRIO", "POLICIES", "TRACE_COLUMNS", "PolicyViolation", "Sample", "SimConfig", "SimResult",
    "Simulator", "TraceError", "TraceJob", "format_table", "jain", "make_las", "parse_nodes", "parse_row", "plot",
    "quantile", "read_trace", "simulate", "write_trace",
]
