"""Triton kernels for one LSTM time step (the pointwise part of the cell).

The recurrent matmul ``h_{t-1} @ W_hh^T`` stays a cuBLAS call; these kernels fuse everything after
it (four gate activations, the cell update, ``tanh(c)``, the output) into one launch forward and one
launch backward, instead of the ~15 small kernels autograd would run per step.

Layouts (all contiguous, one time step): gates ``(B, 4H)`` in torch's gate order ``i, f, g, o``,
states ``(B, H)``. The forward kernel overwrites the pre-activation gates with the activated ones,
which the backward kernel reads. Arithmetic is fp32 whatever the storage dtype; the cell state
``c`` is stored in its buffer's dtype (the caller keeps it fp32 so that bf16/fp16 runs do not
round it at every step) and the running cell gradient ``dc`` is always an fp32 buffer.

Importing this module imports triton: only do it when ``hfai.nn._backend.use_triton`` said so
(or under ``TRITON_INTERPRET=1`` in tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 1024


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _tanh(x):
    # tanh(x) = 2 sigmoid(2x) - 1: saturates cleanly to +-1 where exp overflows.
    return 2.0 * _sigmoid(2.0 * x) - 1.0


@triton.jit
def _lstm_cell_fwd_kernel(G, C_PREV, C, H_OUT, TC, n, H, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    row = offs // H
    gate = G + row * 4 * H + offs % H
    i = _sigmoid(tl.load(gate, mask=mask, other=0.0).to(tl.float32))
    f = _sigmoid(tl.load(gate + H, mask=mask, other=0.0).to(tl.float32))
    g = _tanh(tl.load(gate + 2 * H, mask=mask, other=0.0).to(tl.float32))
    o = _sigmoid(tl.load(gate + 3 * H, mask=mask, other=0.0).to(tl.float32))
    c_prev = tl.load(C_PREV + offs, mask=mask, other=0.0).to(tl.float32)
    c = f * c_prev + i * g
    tc = _tanh(c)
    out_ty = G.dtype.element_ty
    tl.store(gate, i.to(out_ty), mask=mask)
    tl.store(gate + H, f.to(out_ty), mask=mask)
    tl.store(gate + 2 * H, g.to(out_ty), mask=mask)
    tl.store(gate + 3 * H, o.to(out_ty), mask=mask)
    tl.store(C + offs, c.to(C.dtype.element_ty), mask=mask)
    tl.store(TC + offs, tc.to(out_ty), mask=mask)
    tl.store(H_OUT + offs, (o * tc).to(out_ty), mask=mask)


@triton.jit
def _lstm_cell_bwd_kernel(
    D_OUT, DH_REC, DC, G, C_PREV, TC, DG, n, H, HAS_DH_REC: tl.constexpr, BLOCK: tl.constexpr
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    dh = tl.load(D_OUT + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_DH_REC:
        dh += tl.load(DH_REC + offs, mask=mask, other=0.0).to(tl.float32)
    row = offs // H
    col = row * 4 * H + offs % H
    i = tl.load(G + col, mask=mask, other=0.0).to(tl.float32)
    f = tl.load(G + col + H, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + col + 2 * H, mask=mask, other=0.0).to(tl.float32)
    o = tl.load(G + col + 3 * H, mask=mask, other=0.0).to(tl.float32)
    c_prev = tl.load(C_PREV + offs, mask=mask, other=0.0).to(tl.float32)
    tc = tl.load(TC + offs, mask=mask, other=0.0).to(tl.float32)
    dc = tl.load(DC + offs, mask=mask, other=0.0) + dh * o * (1.0 - tc * tc)
    out_ty = DG.dtype.element_ty
    tl.store(DG + col, (dc * g * i * (1.0 - i)).to(out_ty), mask=mask)
    tl.store(DG + col + H, (dc * c_prev * f * (1.0 - f)).to(out_ty), mask=mask)
    tl.store(DG + col + 2 * H, (dc * i * (1.0 - g * g)).to(out_ty), mask=mask)
    tl.store(DG + col + 3 * H, (dh * tc * o * (1.0 - o)).to(out_ty), mask=mask)
    tl.store(DC + offs, dc * f, mask=mask)


def cell_forward(
    gates: torch.Tensor, c_prev: torch.Tensor, c: torch.Tensor, h: torch.Tensor, tc: torch.Tensor
) -> None:
    """One step forward: activates ``gates`` in place and writes ``c``, ``h`` and ``tanh(c)``."""
    n = c_prev.numel()
    grid = (triton.cdiv(n, _BLOCK),)
    _lstm_cell_fwd_kernel[grid](gates, c_prev, c, h, tc, n, c_prev.shape[-1], BLOCK=_BLOCK)


def cell_backward(
    d_out: torch.Tensor,
    dh_rec: torch.Tensor | None,
    dc: torch.Tensor,
    gates: torch.Tensor,
    c_prev: torch.Tensor,
    tc: torch.Tensor,
    d_gates: torch.Tensor,
) -> None:
    """One step backward: writes ``d_gates`` and turns ``dc`` (fp32, in place) into ``dc_prev``.

    ``dh = d_out + dh_rec`` is the gradient reaching this step's ``h`` (``dh_rec`` is the
    recurrent part, ``None`` meaning zero).
    """
    n = dc.numel()
    grid = (triton.cdiv(n, _BLOCK),)
    _lstm_cell_bwd_kernel[grid](
        d_out,
        dh_rec if dh_rec is not None else d_out,
        dc,
        gates,
        c_prev,
        tc,
        d_gates,
        n,
        dc.shape[-1],
        HAS_DH_REC=dh_rec is not None,
        BLOCK=_BLOCK,
    )
