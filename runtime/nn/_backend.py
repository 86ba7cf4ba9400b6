"""Which implementation an op runs for a given tensor.

Triton kernels are used only for CUDA tensors and only when ``triton`` can be imported; every other
case runs the CPU route or torch itself. Nothing here imports triton: the kernel modules are
imported on first use, so ``import hfai.nn`` works on machines without triton or CUDA.
"""

from __future__ import annotations

import functools
import importlib.util

import torch


@functools.cache
def triton_available() -> bool:
    """True when the ``triton`` package is installed (it is not imported here)."""
    return importlib.util.find_spec("triton") is not None


def use_triton(tensor: torch.Tensor) -> bool:
    """True when ``tensor`` should go through the Triton kernels (CUDA tensor, triton installed)."""
    return tensor.is_cuda and triton_available()
