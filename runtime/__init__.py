"""hfai: the in-job runtime of the hfai time-sharing platform.

``import hfai`` stays light (no torch, no nats): the suspend/resume API below is plain Python,
its functions loaded from ``hfai._job`` and ``hfai.watchdog`` at first use.
Heavier subpackages (``hfai.nn``, ``hfai.reduce``, ``hfai.data``, ``hfai.distributed``, ...)
are imported lazily on first attribute access, so existing scripts that do ``import hfai`` and
then call ``hfai.nn.to_hfai(model)`` or ``hfai.client.go_suspend()`` keep working.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from hfai._version import __version__

if TYPE_CHECKING:
    from hfai._job import get_whole_life_state, go_suspend, receive_suspend_command, set_whole_life_state
    from hfai._throughput import report_throughput
    from hfai.watchdog import set_watchdog_time

# The job API's functions, from their modules at first use: every `hfai` command imports this
# package, and a CLI call needs none of them (nor hashlib, json and logging at this point).
_LAZY_FUNCTIONS = {
    "get_whole_life_state": "hfai._job",
    "go_suspend": "hfai._job",
    "receive_suspend_command": "hfai._job",
    "set_whole_life_state": "hfai._job",
    "report_throughput": "hfai._throughput",
    "set_watchdog_time": "hfai.watchdog",
}

# A simulated suspend chain resumes at `import hfai` (hfai._job sets the run's suspend count and
# whole-life state as it loads), before the script reads them from the environment.
if os.environ.get("HFAI_SIMULATE_SUSPEND_S"):
    importlib.import_module("hfai._job")

# In a job on the platform (it has a control directory): a process the watchdog finds hung and
# py-spy cannot read writes its own stacks into the log on a signal (hfai.watchdog). Nowhere else:
# a CLI command or a script off the platform keeps its signals as they were.
if os.environ.get("HFAI_CONTROL_DIR"):
    importlib.import_module("hfai.watchdog").register_stack_dump()

_LAZY_SUBMODULES = frozenset(
    {
        "nn",
        "reduce",
        "data",
        "datasets",
        "client",
        "checkpoint",
        "distributed",
        "multiprocessing",
        "nccl",
        "protocol",
        "controller",
        "agent",
        "cli",
        "config",
    }
)

__all__ = [
    "__version__",
    "get_whole_life_state",
    "go_suspend",
    "receive_suspend_command",
    "report_throughput",
    "set_watchdog_time",
    "set_whole_life_state",
    *sorted(_LAZY_SUBMODULES),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_FUNCTIONS:
        value = getattr(importlib.import_module(_LAZY_FUNCTIONS[name]), name)
        globals()[name] = value
        return value
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f"hfai.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'hfai' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY_FUNCTIONS})
