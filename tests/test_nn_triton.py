"""The Triton kernels of hfai.nn, checked against torch.

Without a GPU they run on CPU under ``TRITON_INTERPRET=1`` (set here, before the kernel modules
are imported, and only when CUDA is absent so that a GPU run compiles them for real). Skipped
when triton is not installed.

Tolerances: kernels compute in fp32. For fp32 inputs the reference is torch in float64 and the
allowed error is a few fp32 ulps of the values' scale (1e-5); LayerNorm's dw/db sum over rows, so
their bound scales with the row count. For fp16 the output is rounded to fp16 (eps ~1e-3).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed"
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # (also set by tests/conftest.py, before any import)


def _ln_reference(x, w, b, dy, eps=1e-5):
    x64 = x.double().requires_grad_()
    w64 = None if w is None else w.double().requires_grad_()
    b64 = None if b is None else b.double().requires_grad_()
    y = torch.nn.functional.layer_norm(x64, (x.shape[-1],), w64, b64, eps)
    y.backward(dy.double())
    return y, x64.grad, None if w is None else w64.grad, None if b is None else b64.grad


@pytest.mark.parametrize("rows,n", [(1, 1), (7, 33), (5, 1000), (3, 4100)])
@pytest.mark.parametrize("affine", ["wb", "w", "none"])
def test_layernorm_kernels_fp32(rows, n, affine):
    from hfai.nn import triton_layernorm

    torch.manual_seed(0)
    x = torch.randn(rows, n, device=DEVICE) * 3 + 1
    w = torch.randn(n, device=DEVICE) if affine != "none" else None
    b = torch.randn(n, device=DEVICE) if affine == "wb" else None
    dy = torch.randn(rows, n, device=DEVICE)
    y, mean, rstd = triton_layernorm.forward(x, w, b, 1e-5)
    dx, dw, db = triton_layernorm.backward(dy, x, w, b is not None, mean, rstd)
    ry, rdx, rdw, rdb = _ln_reference(x, w, b, dy)
    torch.testing.assert_close(y.double(), ry, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx.double(), rdx, rtol=1e-5, atol=1e-4)
    for got, ref in ((dw, rdw), (db, rdb)):
        assert (got is None) == (ref is None)
        if got is not None:
            torch.testing.assert_close(got.double(), ref, rtol=1e-5, atol=1e-5 * rows)


def test_layernorm_kernels_fp16():
    from hfai.nn import triton_layernorm

    torch.manual_seed(0)
    x = torch.randn(6, 77, device=DEVICE).half()
    w = torch.randn(77, device=DEVICE).half()
    b = torch.randn(77, device=DEVICE).half()
    dy = torch.randn(6, 77, device=DEVICE).half()
    y, mean, rstd = triton_layernorm.forward(x, w, b, 1e-5)
    dx, dw, db = triton_layernorm.backward(dy, x, w, True, mean, rstd)
    assert y.dtype == dx.dtype == dw.dtype == torch.float16
    ry, rdx, rdw, rdb = _ln_reference(x, w, b, dy)
    # fp16 storage: the result is within a few half-precision ulps of the exact value.
    for got, ref in ((y, ry), (dx, rdx), (dw, rdw), (db, rdb)):
        torch.testing.assert_close(got.double(), ref, rtol=4e-3, atol=4e-3)


def test_layernorm_function_autograd_matches_torch():
    from hfai.nn.layernorm import LayerNormFunction

    torch.manual_seed(0)
    x = torch.randn(9, 20, device=DEVICE, requires_grad=True)
    w = torch.randn(20, device=DEVICE, requires_grad=True)
    b = torch.randn(20, device=DEVICE, requires_grad=True)
    y = LayerNormFunction.apply(x, w, b, 1e-5)
    (y * y).sum().backward()
    ry, rdx, rdw, rdb = _ln_reference(x.detach(), w.detach(), b.detach(), 2 * y.detach())
    torch.testing.assert_close(y.double(), ry, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), rdx, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(w.grad.double(), rdw, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(b.grad.double(), rdb, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("seq,batch,hidden", [(1, 1, 1), (5, 3, 7)])
def test_lstm_step_kernels_match_torch(seq, batch, hidden):
    from hfai.nn.lstm import LSTMLayerFunction

    torch.manual_seed(0)
    ref = torch.nn.LSTM(4, hidden).double()
    x = torch.randn(seq, batch, 4, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(1, batch, hidden, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(1, batch, hidden, dtype=torch.float64, requires_grad=True)
    out, (h, c) = ref(x, (h0, c0))
    (out.sin().sum() + h.sum() + (c * c).sum()).backward()
    expected = [out, h[0], c[0], x.grad, h0.grad[0], c0.grad[0]]
    expected += [p.grad for p in ref.parameters()]

    leaves = [t.detach().float().to(DEVICE).requires_grad_() for t in (x, h0[0], c0[0])]
    weights = [p.detach().float().to(DEVICE).requires_grad_() for p in ref.parameters()]
    out, h, c = LSTMLayerFunction.apply(*leaves, *weights, True)
    (out.sin().sum() + h.sum() + (c * c).sum()).backward()
    got = [out, h, c, *(t.grad for t in leaves), *(w.grad for w in weights)]
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g.double().cpu(), e, rtol=1e-5, atol=1e-5)


def test_lstm_step_kernels_fp16_keep_cell_state_fp32():
    """fp16 storage: each stored value is within a few half ulps; c is carried in fp32, so the
    error does not grow with the number of steps (checked over 30 steps)."""
    from hfai.nn.lstm import LSTMLayerFunction

    torch.manual_seed(0)
    ref = torch.nn.LSTM(4, 7).double()
    with torch.no_grad():
        for p in ref.parameters():
            p.copy_(p.half().double())  # the reference starts from the same rounded weights
    x = torch.randn(30, 3, 4).half().double().requires_grad_()
    out, (h, c) = ref(x)
    (out.sum() + c.sum()).backward()

    leaves = [x.detach().half().to(DEVICE).requires_grad_()]
    weights = [p.detach().half().to(DEVICE).requires_grad_() for p in ref.parameters()]
    zeros = torch.zeros(3, 7, dtype=torch.float16, device=DEVICE)
    o, hh, cc = LSTMLayerFunction.apply(*leaves, zeros, zeros, *weights, True)
    (o.float().sum() + cc.float().sum()).backward()
    assert o.dtype == cc.dtype == leaves[0].grad.dtype == torch.float16
    torch.testing.assert_close(o.double().cpu(), out, rtol=0, atol=4e-3)
    torch.testing.assert_close(cc.double().cpu(), c[0], rtol=0, atol=4e-3)
    torch.testing.assert_close(leaves[0].grad.double().cpu(), x.grad, rtol=1e-2, atol=1e-2)
    for w, p in zip(weights, ref.parameters(), strict=True):
        torch.testing.assert_close(w.grad.double().cpu(), p.grad, rtol=1e-2, atol=5e-2)
