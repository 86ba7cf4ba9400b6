"""A stage's module as torch's pipelining runs it: checkpointing, and hfreduce DDP kept quiet
until the last micro-batch."""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.utils.checkpoint import checkpoint

from hfai.reduce.ddp import DistributedDataParallel as HfreduceDDP

CHECKPOINT_MODES = ("never", "except_last", "always")


class CheckpointedStage(nn.Module):
    """Runs micro-batch ``i`` of a step under activation checkpointing when the mode asks:
    ``always``, or ``except_last`` for all but the last micro-batch (whose backward comes first,
    so recomputing it would save nothing). :meth:`new_step` resets the count."""

    def __init__(self, module: nn.Module, mode: str, chunks: int) -> None:
        super().__init__()
        self.module = module
        self.mode = mode
        self.chunks = chunks
        self._calls = 0

    def new_step(self) -> None:
        self._calls = 0

    def forward(self, *args):
        index, self._calls = self._calls, self._calls + 1
        wanted = self.mode == "always" or (self.mode == "except_last" and index < self.chunks - 1)
        if not (wanted and torch.is_grad_enabled()):
            return self.module(*args)
        # Recompute the wrapped layers, not an hfreduce DDP's forward: that forward broadcasts
        # buffers, a collective that must not run again inside backward.
        inner = self.module.module if isinstance(self.module, HfreduceDDP) else self.module
        return checkpoint(inner, *args, use_reentrant=False)


class HaiStage(PipelineStage):
    """``PipelineStage`` that defers an hfreduce DDP's gradient all-reduce to the last
    micro-batch's backward (torch's stage does this only for torch's own DDP)."""

    def __init__(self, *args, ddp: HfreduceDDP | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._hfreduce_ddp = ddp

    def backward_maybe_with_nosync(self, backward_type, bwd_kwargs: dict, last_backward: bool = False):
        quiet = self._hfreduce_ddp is not None and not last_backward
        ctx = self._hfreduce_ddp.no_sync() if quiet else contextlib.nullcontext()  # type: ignore[union-attr]
        with ctx:
            return super().backward_maybe_with_nosync(backward_type, bwd_kwargs, last_backward)


def find_hfreduce_ddp(module: nn.Module) -> HfreduceDDP | None:
    return module if isinstance(module, HfreduceDDP) else None
