"""hfai: the in-job runtime of the hfai time-sharing platform.

``import hfai`` stays light (no torch, no nats): the suspend/resume API below is plain Python.
Heavier subpackages (``hfai.nn``, ``hfai.reduce``, ``hfai.data``, ``hfai.distributed``, ...)
are imported lazily on first attribute access, so existing scripts that do ``import hfai`` and
then call ``hfai.nn.to_hfai(model)`` or ``hfai.client.go_suspend()`` keep working.
"""

from __future__ import annotations

import importlib
from typing import Any

from hfai._job import (
    get_whole_life_state,
    go_suspend,
    receive_suspend_command,
    set_whole_life_state,
)
from hfai._version import __version__
from hfai.watchdog import set_watchdog_time

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
    "set_watchdog_time",
    "set_whole_life_state",
    *sorted(_LAZY_SUBMODULES),
]


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        module = importlib.import_module(f"hfai.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module 'hfai' has no attribute {name!r}")
