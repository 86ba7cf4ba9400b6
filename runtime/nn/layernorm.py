"""LayerNorm: Triton kernels behind an autograd.Function, a functional form, and the module.

On CUDA with triton the forward and the backward are one fused kernel each
(:mod:`hfai.nn.triton_layernorm`). On CPU torch's own ``native_layer_norm`` already is one fused
pass forward and one backward; measured, most of its time on the benchmark shape is page faults
on the freshly allocated 128 MiB output and input gradient, which any implementation pays. So the
CPU route is torch's kernel, unchanged (speed ratio 1.0 by construction), rather than a slower
re-implementation. See ``docs/nn.md`` for the ``THP_MEM_ALLOC_ENABLE=1`` setting that removes
most of those page faults for torch and hfai alike.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from hfai.nn._backend import use_triton

# Captured at import so that our fallback still reaches torch after set_replace_torch().
_TORCH_LAYER_NORM = F.layer_norm
_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm over the last dimension of a contiguous 2-D ``(M, N)`` input, Triton kernels.

    ``weight``/``bias`` are ``(N,)`` or None. Statistics and accumulations are fp32 whatever the
    input dtype, as in torch's CUDA kernel.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, eps):  # noqa: D102 (autograd protocol)
        from hfai.nn import triton_layernorm

        y, mean, rstd = triton_layernorm.forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):  # noqa: D102 (autograd protocol)
        from hfai.nn import triton_layernorm

        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = triton_layernorm.backward(dy.contiguous(), x, weight, ctx.has_bias, mean, rstd)
        return dx, dw, db, None


def _triton_applies(input: Tensor, shape: tuple[int, ...], weight, bias) -> bool:
    if not use_triton(input) or input.dtype not in _TRITON_DTYPES or input.numel() == 0:
        return False
    from hfai.nn.triton_layernorm import MAX_N

    if math.prod(shape) > MAX_N or tuple(input.shape[input.dim() - len(shape) :]) != shape:
        return False
    return all(
        p is None or (p.dtype == input.dtype and p.device == input.device and p.is_contiguous())
        for p in (weight, bias)
    )


def layer_norm(
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Drop-in for ``torch.nn.functional.layer_norm``.

    CUDA tensors (fp32/fp16/bf16, normalized size <= 65536) go through the fused Triton kernels;
    everything else runs torch's ``layer_norm``.
    """
    shape = tuple(normalized_shape)
    if not _triton_applies(input, shape, weight, bias):
        return _TORCH_LAYER_NORM(input, shape, weight, bias, eps)
    n = math.prod(shape)
    flat_w = weight.reshape(n) if weight is not None else None
    flat_b = bias.reshape(n) if bias is not None else None
    y = LayerNormFunction.apply(input.reshape(-1, n).contiguous(), flat_w, flat_b, eps)
    return y.view(input.shape)


class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` with fused Triton kernels on CUDA; same arguments, parameters,
    ``state_dict``. On CPU it runs torch's kernel (see this module's docstring for why)."""

    def forward(self, input: Tensor) -> Tensor:  # noqa: D102 (same as torch.nn.LayerNorm)
        return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
