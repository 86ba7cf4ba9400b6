"""hfai.nn.MultiheadAttention against torch.nn.MultiheadAttention on CPU.

Tolerances: in float64 hfai runs the same kernels as torch on differently laid-out views, and
for need_weights=True the output comes from the fused kernel instead of softmax(QK^T)V, so only
rounding differs: we allow 1e-10. In float32/bfloat16 both are compared to a float64 reference
and hfai must be within a small multiple of torch's own rounding error. Masked-out rows must be
NaN exactly where torch's are.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hfai.nn
from hfai.nn import attention as attention_mod

E, HEADS = 8, 2
L, S, N = 5, 7, 3


def _pair(dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(E, HEADS, **kwargs).to(dtype)
    ours = hfai.nn.MultiheadAttention(E, HEADS, **kwargs).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _run(module, q, k, v, **call):
    for t in {id(t): t for t in (q, k, v)}.values():
        t.grad = None
    module.zero_grad(set_to_none=True)
    out, weights = module(q, k, v, **call)
    loss = out.nan_to_num().sin().sum()
    if weights is not None:
        loss = loss + weights.nan_to_num().pow(2).sum()
    loss.backward()
    grads = [t.grad for t in {id(t): t for t in (q, k, v)}.values()]
    return [out, weights, *grads, *(p.grad for p in module.parameters())]


def _assert_same(got, expected, tol):
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        if e is None:
            assert g is None
            continue
        assert torch.equal(g.isnan(), e.isnan())
        torch.testing.assert_close(g.nan_to_num(), e.nan_to_num(), rtol=tol, atol=tol)


def _inputs(kind, batch_first, dtype=torch.float64, kdim=E):
    def make(seq, dim):
        shape = (N, seq, dim) if batch_first else (seq, N, dim)
        return torch.randn(shape, dtype=dtype, requires_grad=True)

    q = make(L, E)
    if kind == "self":
        return q, q, q
    k = make(S, kdim)
    return (q, k, k) if kind == "kv-shared" else (q, k, make(S, kdim))


def _padding(all_masked_row=False):
    mask = torch.zeros(N, S, dtype=torch.bool)
    mask[1, 3:] = True
    if all_masked_row:
        mask[2, :] = True
    return mask


CALLS = {
    "default": {},
    "no-weights": dict(need_weights=False),
    "per-head-weights": dict(average_attn_weights=False),
    "padding": dict(key_padding_mask=_padding()),
    "padding-no-weights": dict(key_padding_mask=_padding(), need_weights=False),
    "all-masked-row": dict(key_padding_mask=_padding(True)),
    "all-masked-row-no-weights": dict(key_padding_mask=_padding(True), need_weights=False),
    "bool-attn-mask": dict(attn_mask=torch.rand(L, S) > 0.7, key_padding_mask=_padding()),
    "float-3d-mask": dict(attn_mask=torch.randn(N * HEADS, L, S, dtype=torch.float64)),
    "float-3d-mask-no-weights": dict(
        attn_mask=torch.randn(N * HEADS, L, S, dtype=torch.float64), need_weights=False
    ),
}


# Masks are shaped for S != L, so they go with cross attention (self attention: see below).
_COMBOS = [(c, k) for c in CALLS for k in ("self", "kv-shared", "cross") if k != "self" or not
           any(word in c for word in ("mask", "padding", "row"))]  # fmt: skip


@pytest.mark.parametrize("call,kind", _COMBOS, ids=lambda v: str(v))
@pytest.mark.parametrize("batch_first", [False, True])
def test_matches_torch_float64(call, kind, batch_first):
    ref, ours = _pair(batch_first=batch_first)
    q, k, v = _inputs(kind, batch_first)
    _assert_same(_run(ours, q, k, v, **CALLS[call]), _run(ref, q, k, v, **CALLS[call]), 1e-10)


def test_self_attention_with_causal_float_mask():
    ref, ours = _pair()
    q, k, v = _inputs("self", False)
    mask = torch.triu(torch.full((L, L), float("-inf"), dtype=torch.float64), 1)
    for need in (True, False):
        call = dict(attn_mask=mask, need_weights=need)
        _assert_same(_run(ours, q, k, v, **call), _run(ref, q, k, v, **call), 1e-10)


def test_kdim_vdim_separate_projections():
    ref, ours = _pair(kdim=4, vdim=4)
    q, k, v = _inputs("cross", False, kdim=4)
    _assert_same(_run(ours, q, k, v), _run(ref, q, k, v), 1e-10)


def test_no_bias():
    ref, ours = _pair(bias=False)
    q, k, v = _inputs("self", True)
    _assert_same(_run(ours, q, k, v), _run(ref, q, k, v), 1e-10)


@pytest.mark.parametrize("dtype,factor", [(torch.float32, 4), (torch.bfloat16, 4)])
@pytest.mark.parametrize("need_weights", [True, False])
def test_low_precision_no_less_accurate_than_torch(dtype, factor, need_weights):
    ref64, _ = _pair()
    ref, ours = _pair(dtype)
    q64, _, _ = _inputs("self", False)
    exact = _run(ref64, q64, q64, q64, need_weights=need_weights)
    q = q64.detach().to(dtype).requires_grad_()
    theirs = _run(ref, q, q, q, need_weights=need_weights)
    mine = _run(ours, q, q, q, need_weights=need_weights)
    for m, t, e in zip(mine, theirs, exact, strict=True):
        if e is None:
            continue
        torch_err = (t.double() - e).abs().max().item()
        eps = torch.finfo(dtype).eps
        assert (m.double() - e).abs().max().item() <= factor * torch_err + 4 * eps


@pytest.mark.parametrize(
    "kwargs,call,train",
    [
        (dict(add_bias_kv=True), {}, False),
        (dict(add_zero_attn=True), {}, False),
        (dict(dropout=0.5), {}, True),
        ({}, dict(is_causal=True, attn_mask=torch.ones(L, L, dtype=torch.bool).triu(1)), False),
    ],
    ids=["bias_kv", "zero_attn", "dropout-train", "is_causal"],
)
def test_unaccelerated_cases_run_torch(monkeypatch, kwargs, call, train):
    ref, ours = _pair(**kwargs)
    ref.train(train), ours.train(train)

    def fail(*args, **kw):
        raise AssertionError("hfai's attention must not run for this case")

    monkeypatch.setattr(attention_mod, "attention", fail)
    q, k, v = _inputs("self", False)
    torch.manual_seed(5)
    expected = ref(q, k, v, **call)
    torch.manual_seed(5)
    got = ours(q, k, v, **call)
    assert torch.equal(got[0], expected[0])


def test_unbatched_input_runs_torch():
    ref, ours = _pair()
    x = torch.randn(L, E, dtype=torch.float64)
    assert torch.equal(ours(x, x, x)[0], ref(x, x, x)[0])


def test_wrong_embed_dim_raises_torch_error():
    _, ours = _pair()
    x = torch.randn(L, N, E + 1, dtype=torch.float64)
    with pytest.raises(AssertionError):
        ours(x, x, x)


def test_functional_form_matches_torch():
    ref, _ = _pair()
    q, k, v = _inputs("cross", False)
    args = (q, k, v, E, HEADS, ref.in_proj_weight, ref.in_proj_bias, None, None, False, 0.0,
            ref.out_proj.weight, ref.out_proj.bias)  # fmt: skip
    kwargs = dict(training=True, key_padding_mask=_padding(), need_weights=True)
    expected = F.multi_head_attention_forward(*args, **kwargs)
    got = hfai.nn.functional.multi_head_attention_forward(*args, **kwargs)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_state_dict_matches_torch():
    ref, ours = _pair(batch_first=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert isinstance(ours, torch.nn.MultiheadAttention)


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("kind", ["self", "cross"])
def test_inference_matches_torch(need_weights, kind):
    ref, ours = _pair()
    ref.eval(), ours.eval()
    q, k, v = (t.detach() for t in _inputs(kind, False))
    with torch.inference_mode():
        expected = ref(q, k, v, need_weights=need_weights, key_padding_mask=None)
        got = ours(q, k, v, need_weights=need_weights)
    for g, e in zip(got, expected, strict=True):
        if e is None:
            assert g is None
        else:
            torch.testing.assert_close(g, e, rtol=1e-10, atol=1e-10)


def test_inference_with_weights_uses_torchs_fused_path(monkeypatch):
    ref, ours = _pair(batch_first=True)
    ref.eval(), ours.eval()
    monkeypatch.setattr(attention_mod, "attention", lambda *a, **k: pytest.fail("hfai route ran"))
    x = torch.randn(N, L, E, dtype=torch.float64)
    with torch.no_grad():
        got, expected = ours(x, x, x), ref(x, x, x)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
