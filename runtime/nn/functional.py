"""Functional forms of hfai.nn's operators, and ``set_replace_torch``.

``layer_norm`` and ``multi_head_attention_forward`` take exactly the arguments of their
``torch.nn.functional`` namesakes; ``lstm`` takes those of ``torch._VF.lstm`` (what
``nn.LSTM.forward`` calls; torch has no public functional LSTM). Each falls back to torch's own
code for the cases it does not accelerate.
"""

from __future__ import annotations

import torch.nn.functional as F

from hfai.nn.attention import _TORCH_MHA_FORWARD, attention, multi_head_attention_forward
from hfai.nn.layernorm import _TORCH_LAYER_NORM, layer_norm
from hfai.nn.lstm import lstm, lstm_layer

__all__ = [
    "attention",
    "layer_norm",
    "lstm",
    "lstm_layer",
    "multi_head_attention_forward",
    "set_replace_torch",
]

_REPLACEMENTS = {
    "layer_norm": (_TORCH_LAYER_NORM, layer_norm),
    "multi_head_attention_forward": (_TORCH_MHA_FORWARD, multi_head_attention_forward),
}


def set_replace_torch(enable: bool = True) -> None:
    """Make ``torch.nn.functional.layer_norm`` and ``.multi_head_attention_forward`` hfai's.

    Afterwards every ``torch.nn.LayerNorm`` and ``torch.nn.MultiheadAttention`` (and any code that
    calls these through the ``torch.nn.functional`` module) uses hfai's implementation, without
    converting the model. ``set_replace_torch(False)`` restores torch's functions; calling either
    twice is harmless. Code that bound the function earlier (``from torch.nn.functional import
    layer_norm``) keeps torch's. LSTM has no functional form in torch to patch: use
    ``hfai.nn.to_hfai`` for it.
    """
    for name, (original, ours) in _REPLACEMENTS.items():
        setattr(F, name, ours if enable else original)
