"""``hfai.client``: the names existing hfai scripts call.

In a job: ``hfai.client.receive_suspend_command()``, ``go_suspend()`` and the whole-life state,
plain Python as ever; ``report_throughput(n, unit="samples")`` (:mod:`hfai._throughput`: what the
scheduler sizes an elastic job by); ``bind_hf_except_hook(Process)`` (:mod:`hfai.except_hook`) and
``set_watchdog_time`` (:mod:`hfai.watchdog`: the job's log watchdog). From anywhere with
credentials: the submission API of :mod:`hfai.experiment` (``create_experiment``, ``submit``, ``get_experiment``,
``list_experiments``, ``Experiment``, ``Client``), loaded on first use so that a job importing
this module for the suspend calls does not import nats.
"""

from __future__ import annotations

import importlib
from typing import Any

from hfai._job import get_whole_life_state, go_suspend, receive_suspend_command, set_whole_life_state
from hfai._throughput import report_throughput
from hfai.except_hook import bind_hf_except_hook
from hfai.watchdog import set_watchdog_time

_SUBMISSION = frozenset({"Client", "Experiment", "create_experiment", "get_experiment", "list_experiments", "submit"})

__all__ = ["bind_hf_except_hook", "get_whole_life_state", "go_suspend", "receive_suspend_command",
           "report_throughput", "set_watchdog_time", "set_whole_life_state", *sorted(_SUBMISSION)]


def __getattr__(name: str) -> Any:
    if name in _SUBMISSION:
        value = getattr(importlib.import_module("hfai.experiment"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hfai.client' has no attribute {name!r}")
