"""``hfai.nccl``: where the original hfai client kept its ``torch.distributed`` drop-in.

Scripts derived from hfai-models do ``import hfai.nccl.distributed as dist``. That module *is*
:mod:`hfai.distributed` (the same module object, not a copy), so the two names can never drift
apart. Light like ``import hfai``: torch is imported only when a torch name is first used.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    # After a bare `import hfai`, `hfai.nccl.distributed` must work as an attribute too.
    if name == "distributed":
        return importlib.import_module("hfai.nccl.distributed")
    raise AttributeError(f"module 'hfai.nccl' has no attribute {name!r}")
