"""Triton kernels for LayerNorm over the last dimension: fused forward and fused backward.

Forward: one program per row computes mean, ``rstd = 1/sqrt(var + eps)`` and the affine output in
fp32, and stores mean and rstd (fp32) for the backward. Backward: each program walks a contiguous
block of rows, writes ``dx`` per row and accumulates ``dw``/``db`` in fp32 registers; the per-
program partial sums are added by one small torch reduction (no atomics, deterministic).

A row must fit one block (``N <= MAX_N``); callers fall back to torch above that.
Importing this module imports triton: only do it when ``hfai.nn._backend.use_triton`` said so
(or under ``TRITON_INTERPRET=1`` in tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_N = 65536


@triton.jit
def _layer_norm_fwd_kernel(
    X, Y, W, B, MEAN, RSTD, N, eps, HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * N + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / N
    xc = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(xc * xc, axis=0) / N + eps)
    y = xc * rstd
    if HAS_W:
        y = y * tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_B:
        y = y + tl.load(B + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * N + cols, y.to(Y.dtype.element_ty), mask=mask)
    tl.store(MEAN + row, mean)
    tl.store(RSTD + row, rstd)


@triton.jit
def _layer_norm_bwd_kernel(
    X, DY, DX, W, MEAN, RSTD, DW, DB, M, N, rows_per_program,
    HAS_W: tl.constexpr, HAS_B: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    if HAS_W:
        w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    else:
        w = tl.where(mask, 1.0, 0.0)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)
    db = tl.zeros((BLOCK,), dtype=tl.float32)
    start = pid * rows_per_program
    end = tl.minimum(start + rows_per_program, M)
    # Row pointers advance by N per row; the 64-bit start keeps huge inputs from overflowing.
    first = start.to(tl.int64) * N
    x_ptr = X + first + cols
    dy_ptr = DY + first + cols
    dx_ptr = DX + first + cols
    for row in range(start, end):
        x = tl.load(x_ptr, mask=mask, other=0.0).to(tl.float32)
        dy = tl.load(dy_ptr, mask=mask, other=0.0).to(tl.float32)
        mean = tl.load(MEAN + row)
        rstd = tl.load(RSTD + row)
        xhat = tl.where(mask, (x - mean) * rstd, 0.0)
        wdy = w * dy
        c1 = tl.sum(xhat * wdy, axis=0) / N
        c2 = tl.sum(wdy, axis=0) / N
        dx = (wdy - (xhat * c1 + c2)) * rstd
        tl.store(dx_ptr, dx.to(DX.dtype.element_ty), mask=mask)
        dw += dy * xhat
        db += dy
        x_ptr += N
        dy_ptr += N
        dx_ptr += N
    if HAS_W:
        tl.store(DW + pid * N + cols, dw, mask=mask)
    if HAS_B:
        tl.store(DB + pid * N + cols, db, mask=mask)


def _settings(n: int) -> tuple[int, int]:
    """Block size (a power of two >= n) and warps, as Liger-Kernel/Triton tutorials choose them."""
    block = triton.next_power_of_2(n)
    warps = 4 if block < 2048 else 8 if block < 8192 else 16 if block < 32768 else 32
    return block, warps


def _programs(x: torch.Tensor, rows: int) -> int:
    if x.is_cuda:
        return min(rows, torch.cuda.get_device_properties(x.device).multi_processor_count * 4)
    return min(rows, 4)  # the interpreter (tests): a few programs cover the cross-program sum


def forward(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x`` is 2-D ``(M, N)``, contiguous. Returns ``(y, mean, rstd)``, mean/rstd fp32 ``(M,)``."""
    rows, n = x.shape
    y = torch.empty_like(x)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device)
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    block, warps = _settings(n)
    _layer_norm_fwd_kernel[(rows,)](
        x, y, weight, bias, mean, rstd, n, eps,
        HAS_W=weight is not None, HAS_B=bias is not None, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    return y, mean, rstd


def backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor | None,
    has_bias: bool,
    mean: torch.Tensor,
    rstd: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Returns ``(dx, dw, db)`` (``dw``/``db`` None without weight/bias), in the inputs' dtypes."""
    rows, n = x.shape
    dx = torch.empty_like(x)
    programs = max(_programs(x, rows), 1)
    partial = (programs, n)
    dw = torch.empty(partial, dtype=torch.float32, device=x.device) if weight is not None else None
    db = torch.empty(partial, dtype=torch.float32, device=x.device) if has_bias else None
    block, warps = _settings(n)
    _layer_norm_bwd_kernel[(programs,)](
        x, dy, dx, weight, mean, rstd, dw, db, rows, n, triton.cdiv(rows, programs),
        HAS_W=weight is not None, HAS_B=has_bias, BLOCK=block, num_warps=warps,
    )  # fmt: skip
    dtype = weight.dtype if weight is not None else x.dtype
    return (
        dx,
        dw.sum(0).to(dtype) if dw is not None else None,
        db.sum(0).to(dtype) if db is not None else None,
    )
