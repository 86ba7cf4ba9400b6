"""hfai.nn: drop-in, faster versions of torch's LayerNorm, MultiheadAttention and LSTM.

``hfai.nn.to_hfai(model)`` switches a model's torch modules to these;
``hfai.nn.functional.set_replace_torch()`` patches torch's functional forms instead. Each op falls
back to torch for the cases it does not accelerate; ``docs/nn.md`` lists them with the measured
speed-ups and the numerical tolerances. Triton kernels (CUDA) are imported only when used, so this
package imports on machines without triton or a GPU. ``hfai.nn.parallel`` is loaded on first
access.
"""

from __future__ import annotations

import importlib
from typing import Any

from hfai.nn import functional
from hfai.nn.attention import MultiheadAttention
from hfai.nn.convert import to_hfai
from hfai.nn.layernorm import LayerNorm
from hfai.nn.lstm import LSTM

__all__ = ["LSTM", "LayerNorm", "MultiheadAttention", "functional", "parallel", "to_hfai"]

_LAZY_SUBMODULES = frozenset({"parallel"})


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"hfai.nn.{name}")
    raise AttributeError(f"module 'hfai.nn' has no attribute {name!r}")
