"""``to_hfai``: switch a model's torch LayerNorm / MultiheadAttention / LSTM to hfai's."""

from __future__ import annotations

import copy

import torch

from hfai.nn.attention import MultiheadAttention
from hfai.nn.layernorm import LayerNorm
from hfai.nn.lstm import LSTM

# Exact types only: a user's subclass may override forward, and replacing its class would drop it.
_SWAPS: dict[type, type] = {
    torch.nn.LayerNorm: LayerNorm,
    torch.nn.MultiheadAttention: MultiheadAttention,
    torch.nn.LSTM: LSTM,
}


def to_hfai(model: torch.nn.Module, contiguous_param: bool = False, verbose: bool = False, *,
            inplace: bool = True) -> torch.nn.Module:
    """Return ``model`` with every ``torch.nn.LayerNorm``, ``MultiheadAttention`` and ``LSTM``
    (exact types, at any depth, ``model`` itself included) switched to hfai's version.

    The arguments are the original's, in its order. ``contiguous_param=True`` asked the original
    to lay all parameters out in one flat buffer (faster fused optimizer steps); here it is
    accepted and changes nothing (parameters keep their own storage, so optimizers and
    ``state_dict`` are unaffected either way). ``inplace`` is keyword only: it was the second
    positional argument here before, which the original gives to ``contiguous_param``.

    The hfai modules are subclasses that add no state, so the switch changes only each module's
    class: parameters, buffers, devices, dtypes, hooks, training mode and ``state_dict`` keys stay
    as they were, and optimizers built earlier keep working. With ``inplace=False`` a deep copy is
    converted and ``model`` is left untouched. ``verbose=True`` prints one line per module switched.
    """
    for arg, value in (("contiguous_param", contiguous_param), ("inplace", inplace)):
        if not isinstance(value, bool):
            raise TypeError(f"to_hfai({arg}=...) takes True or False, got {value!r}")
    if not inplace:
        model = copy.deepcopy(model)
    for name, module in model.named_modules():
        target = _SWAPS.get(type(module))
        if target is None:
            continue
        module.__class__ = target
        if verbose:
            kind = target.__name__
            print(f"hfai.nn.to_hfai: {name or '<model>'}: torch.nn.{kind} -> hfai.nn.{kind}")
    return model
