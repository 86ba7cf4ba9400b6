"""CUDA helpers: page-lock shared memory so device copies are DMA'd straight into it.

Everything here is a no-op without a CUDA device, which is how the CPU test suite runs.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def available() -> bool:
    return torch.cuda.is_available()


def pin(host: torch.Tensor) -> bool:
    """Register ``host``'s memory with CUDA (page-locked) so ``copy_(non_blocking=True)`` between
    it and device tensors is asynchronous. Returns whether it was registered."""
    if not available() or host.numel() == 0:
        return False
    err = torch.cuda.cudart().cudaHostRegister(host.data_ptr(), host.nbytes, 0)
    if int(err) != 0:
        # Not fatal: copies still work, only synchronously and through a staging buffer.
        logger.warning("cudaHostRegister failed (%s); device copies will not overlap", err)
        return False
    return True


def unpin(host: torch.Tensor) -> None:
    if available() and host.numel():
        torch.cuda.cudart().cudaHostUnregister(host.data_ptr())
