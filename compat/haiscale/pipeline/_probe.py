"""Shape probing: one real micro-batch walked through the stages to learn what flows between them.

torch's ``PipelineStage`` either takes example inputs/outputs (static mode) or infers them by
running every stage on uninitialised tensors (dynamic mode). Uninitialised inputs break models
that index with an activation (edge lists passed along a graph network) and can write NaN into
BatchNorm statistics, so the pipeline builds its stages statically from this probe instead: each
stage runs once on the real first micro-batch it would receive, with its buffers and the RNG put
back afterwards, and sends its real outputs on. It runs once per new input signature.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from haiscale.pipeline.errors import PipelineError


@dataclass(frozen=True)
class TensorSig:
    """What a receiving stage needs to allocate one tensor of an activation."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    requires_grad: bool

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorSig:
        return cls(tuple(t.shape), t.dtype, bool(t.requires_grad))


def as_tensor_tuple(value, what: str) -> tuple[torch.Tensor, ...]:
    """A stage's inputs or outputs as a tuple of tensors; anything else is an error."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    for v in values:
        if not isinstance(v, torch.Tensor):
            raise PipelineError(
                f"{what} must be tensors (a tensor or a tuple of tensors) to pass between pipeline "
                f"stages, got {type(v).__name__}"
            )
    return tuple(values)


@contextlib.contextmanager
def _state_restored(module: nn.Module, device: torch.device) -> Iterator[None]:
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        try:
            yield
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)


def run_stage(module: nn.Module, inputs: tuple[torch.Tensor, ...], device: torch.device, grad: bool):
    """Run ``module`` once on ``inputs`` and return detached outputs that keep ``requires_grad``."""
    with _state_restored(module, device), torch.set_grad_enabled(grad):
        outputs = as_tensor_tuple(module(*inputs), f"the outputs of {type(module).__name__}")
    return tuple(o.detach().requires_grad_(o.requires_grad and o.is_floating_point()) for o in outputs)


def send_activation(tensors: tuple[torch.Tensor, ...], dst: int, group, device: torch.device) -> None:
    """Send signatures, then the tensors, to global rank ``dst``."""
    dist.send_object_list([[TensorSig.of(t) for t in tensors]], dst=dst, group=group, device=device)
    for t in tensors:
        dist.send(t.detach().contiguous(), dst=dst, group=group)


def recv_activation(src: int, group, device: torch.device, grad: bool) -> tuple[torch.Tensor, ...]:
    """Receive what :func:`send_activation` sent from global rank ``src``."""
    box: list = [None]
    dist.recv_object_list(box, src=src, group=group, device=device)
    out = []
    for sig in box[0]:
        t = torch.empty(sig.shape, dtype=sig.dtype, device=device)
        dist.recv(t, src=src, group=group)
        out.append(t.requires_grad_(grad and sig.requires_grad and t.is_floating_point()))
    return tuple(out)
