"""``haiscale.fsdp``: fully sharded data parallelism as hfai scripts call it, on torch's FSDP.

:class:`FullyShardedDataParallel` is ``torch.distributed.fsdp.FullyShardedDataParallel`` with
haiscale's two conveniences: ``model.summon_full_params()`` works on the instance (torch's is a
static method taking the module), and a module on the CPU is sharded on the CPU without naming
``device_id``. ``BackwardPrefetch``, ``ShardingStrategy``, ``MixedPrecision`` and ``CPUOffload``
are torch's.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.distributed.fsdp import BackwardPrefetch, CPUOffload, MixedPrecision, ShardingStrategy
from torch.distributed.fsdp import FullyShardedDataParallel as _TorchFSDP

__all__ = [
    "BackwardPrefetch",
    "CPUOffload",
    "FullyShardedDataParallel",
    "MixedPrecision",
    "ShardingStrategy",
]


class _InstanceOrStatic:
    """``obj.summon_full_params(...)`` binds ``obj`` as the module; ``Class.summon_full_params(m,
    ...)`` stays torch's static call."""

    def __init__(self, fn) -> None:
        self._fn = fn
        self.__doc__ = fn.__doc__

    def __get__(self, obj, objtype=None):
        return self._fn if obj is None else functools.partial(self._fn, obj)


def _on_cpu(module: nn.Module) -> bool:
    tensors = list(module.parameters()) + list(module.buffers())
    return bool(tensors) and all(t.device.type == "cpu" for t in tensors)


class FullyShardedDataParallel(_TorchFSDP):
    """torch's FSDP (same arguments). Collective over ``process_group`` (default: the world).

    ``device_id`` defaults to the CPU when every parameter and buffer of ``module`` is on the
    CPU (torch would otherwise look for a GPU); pass it as with torch for GPU modules.
    """

    def __init__(self, module: nn.Module, *args, **kwargs) -> None:
        if kwargs.get("device_id") is None and not args and _on_cpu(module):
            kwargs["device_id"] = torch.device("cpu")
        super().__init__(module, *args, **kwargs)

    summon_full_params = _InstanceOrStatic(_TorchFSDP.summon_full_params)
