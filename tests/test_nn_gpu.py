"""hfai.nn on a CUDA device (Triton kernels compiled for real). Skipped without CUDA + triton.

Tolerances: each result is compared with torch computing in float64 from the same inputs, and
hfai's error must stay within a small multiple of torch's own error in the same dtype (plus a few
ulps), i.e. the fused kernels are no less accurate than torch's.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import hfai.nn

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("triton") is None,
        reason="needs a CUDA device and triton",
    ),
]


def _errors(make, run, dtype):
    """Max abs error of (torch in dtype, hfai in dtype) against torch in float64, per output."""
    torch.manual_seed(0)
    ref64, ref, ours, inputs = make(dtype)
    exact = run(ref64, [t.double().requires_grad_() for t in inputs])
    theirs = run(ref, [t.clone().requires_grad_() for t in inputs])
    mine = run(ours, [t.clone().requires_grad_() for t in inputs])
    for m, t, e in zip(mine, theirs, exact, strict=True):
        yield (m.double() - e).abs().max().item(), (t.double() - e).abs().max().item()


def _modules(cls_torch, cls_hfai, args, dtype, shapes):
    ref64 = cls_torch(*args).cuda().double()
    ref = cls_torch(*args).cuda().to(dtype)
    ours = cls_hfai(*args).cuda().to(dtype)
    ref.load_state_dict(ref64.state_dict())
    ours.load_state_dict(ref64.state_dict())
    inputs = [torch.randn(s, device="cuda").to(dtype) for s in shapes]
    return ref64, ref, ours, inputs


def _run_grads(module, inputs):
    out = module(*inputs)
    out = out[0] if isinstance(out, tuple) else out
    out.float().sin().sum().backward()
    return [out, *(t.grad for t in inputs), *(p.grad for p in module.parameters())]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(3, 7, 33), (4, 1024), (2, 5, 4097)])
def test_layernorm_cuda(dtype, shape):
    def make(dt):
        return _modules(torch.nn.LayerNorm, hfai.nn.LayerNorm, (shape[-1],), dt, [shape])

    eps = torch.finfo(dtype).eps
    for mine, theirs in _errors(make, _run_grads, dtype):
        assert mine <= 4 * theirs + 8 * eps * shape[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lstm_cuda(dtype):
    def make(dt):
        return _modules(torch.nn.LSTM, hfai.nn.LSTM, (16, 32, 2), dt, [(9, 4, 16)])

    eps = torch.finfo(dtype).eps
    for mine, theirs in _errors(make, _run_grads, dtype):
        assert mine <= 4 * theirs + 64 * eps


@pytest.mark.parametrize("need_weights", [True, False])
def test_mha_cuda(need_weights):
    def make(dt):
        return _modules(torch.nn.MultiheadAttention, hfai.nn.MultiheadAttention, (32, 4), dt,
                        [(6, 3, 32)] * 3)  # fmt: skip

    def run(module, inputs):
        out, _ = module(*inputs, need_weights=need_weights)
        out.sin().sum().backward()
        return [out, *(t.grad for t in inputs), *(p.grad for p in module.parameters())]

    for mine, theirs in _errors(make, run, torch.float32):
        assert mine <= 4 * theirs + 1e-5
