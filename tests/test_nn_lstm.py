"""hfai.nn.LSTM against torch.nn.LSTM on CPU: outputs, final states and every gradient.

On CPU hfai.nn.LSTM normally runs torch's kernel; the autouse fixture below switches on hfai's
own route (the code CUDA runs, with the pure-torch step instead of the Triton one) so that these
tests check it. ``test_cpu_runs_torch_by_default`` checks the default.

Tolerances: in float64 only the order of floating-point sums differs from torch (one big matmul
instead of per-step ones, gradients summed over the sequence at once), so results agree to
~1e-12 relative; we allow 1e-9. In float32 we compare both implementations to a float64
reference and require hfai's error to stay within a small multiple of torch's own float32 error
(plus 1e-6 absolute), i.e. "no less accurate than torch".
"""

from __future__ import annotations

import pytest
import torch

import hfai.nn
from hfai.nn import lstm as lstm_mod
from hfai.nn.lstm import LSTMLayerFunction

INPUT, HIDDEN = 7, 5


@pytest.fixture(autouse=True)
def _hfai_route_on_cpu(monkeypatch):
    monkeypatch.setattr(lstm_mod, "_ROUTE_CPU", True)


def _pair(dtype=torch.float64, **kwargs):
    torch.manual_seed(0)
    ref = torch.nn.LSTM(INPUT, HIDDEN, **kwargs).to(dtype)
    ours = hfai.nn.LSTM(INPUT, HIDDEN, **kwargs).to(dtype)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _run(module, x, hx):
    """Forward, a loss touching output and both final states, backward; return all tensors."""
    for t in (x, *(hx or ())):
        t.grad = None
    module.zero_grad(set_to_none=True)
    out, (h, c) = module(x, hx)
    (out.sin().sum() + h.cos().sum() + (c * c).sum()).backward()
    grads = [t.grad for t in (x, *(hx or ()))]
    return [out, h, c, *grads, *(p.grad for p in module.parameters())]


def _inputs(seq, batch, layers, directions, dtype, batch_first=False, with_hx=True):
    shape = (batch, seq, INPUT) if batch_first else (seq, batch, INPUT)
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    if not with_hx:
        return x, None
    state = (layers * directions, batch, HIDDEN)
    h0 = torch.randn(state, dtype=dtype, requires_grad=True)
    c0 = torch.randn(state, dtype=dtype, requires_grad=True)
    return x, (h0, c0)


CASES = [
    dict(num_layers=1),
    dict(num_layers=2),
    dict(num_layers=3, bidirectional=True),
    dict(num_layers=2, batch_first=True),
    dict(num_layers=2, bias=False),
    dict(num_layers=2, dropout=0.5),  # dropout is inactive in eval mode: accelerated
]


@pytest.mark.parametrize("kwargs", CASES, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize("seq,batch", [(1, 1), (6, 3), (11, 2)])
@pytest.mark.parametrize("with_hx", [True, False])
def test_matches_torch_float64(kwargs, seq, batch, with_hx):
    ref, ours = _pair(**kwargs)
    if kwargs.get("dropout"):
        ref.eval(), ours.eval()
    directions = 2 if kwargs.get("bidirectional") else 1
    x, hx = _inputs(seq, batch, ref.num_layers, directions, torch.float64,
                    kwargs.get("batch_first", False), with_hx)  # fmt: skip
    expected = _run(ref, x, hx)
    got = _run(ours, x, hx)
    assert len(got) == len(expected)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9)


def test_float32_no_less_accurate_than_torch():
    ref64, _ = _pair(num_layers=2)
    ref32, ours32 = _pair(torch.float32, num_layers=2)
    torch.manual_seed(1)
    x, hx = _inputs(40, 4, 2, 1, torch.float64)
    exact = _run(ref64, x, hx)
    x32 = x.detach().float().requires_grad_()
    hx32 = tuple(t.detach().float().requires_grad_() for t in hx)
    theirs = _run(ref32, x32, hx32)
    mine = _run(ours32, x32, hx32)
    for m, t, e in zip(mine, theirs, exact, strict=True):
        torch_err = (t.double() - e).abs().max().item()
        assert (m.double() - e).abs().max().item() <= 4 * torch_err + 1e-6


def test_unbatched_input():
    ref, ours = _pair(num_layers=2)
    x = torch.randn(5, INPUT, dtype=torch.float64, requires_grad=True)
    hx = tuple(torch.randn(2, HIDDEN, dtype=torch.float64, requires_grad=True) for _ in range(2))
    for g, e in zip(_run(ours, x, hx), _run(ref, x, hx), strict=True):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9)


def test_input_without_grad_and_frozen_weights():
    ref, ours = _pair(num_layers=2)
    ours.weight_ih_l0.requires_grad_(False)
    ref.weight_ih_l0.requires_grad_(False)
    x = torch.randn(4, 3, INPUT, dtype=torch.float64)
    out_r, _ = ref(x)
    out_o, _ = ours(x)
    out_r.sum().backward()
    out_o.sum().backward()
    torch.testing.assert_close(out_o, out_r, rtol=1e-9, atol=1e-9)
    assert ours.weight_ih_l0.grad is None
    torch.testing.assert_close(ours.weight_hh_l0.grad, ref.weight_hh_l0.grad, rtol=1e-9, atol=1e-9)


def test_layer_function_gradcheck():
    torch.manual_seed(0)
    args = [torch.randn(s, dtype=torch.float64, requires_grad=True)
            for s in [(4, 2, 3), (2, 5), (2, 5), (20, 3), (20, 5), (20,), (20,)]]  # fmt: skip
    assert torch.autograd.gradcheck(lambda *a: LSTMLayerFunction.apply(*a), args)


def test_state_dict_and_repr_match_torch():
    ref, ours = _pair(num_layers=2, bidirectional=True)
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert repr(ours) == repr(ref)
    assert isinstance(ours, torch.nn.LSTM)


def _packed(module, x):
    lengths = torch.tensor([x.shape[0], x.shape[0] - 2])
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths)
    out, _ = module(packed)
    return torch.nn.utils.rnn.pad_packed_sequence(out)[0]


@pytest.mark.parametrize(
    "kwargs,call",
    [
        (dict(num_layers=2), _packed),
        (dict(num_layers=1, proj_size=3), lambda m, x: m(x)[0]),
        (dict(num_layers=2, dropout=0.5), lambda m, x: m(x)[0]),  # training mode: torch's RNG
    ],
    ids=["packed", "proj_size", "dropout-train"],
)
def test_unaccelerated_cases_run_torch(monkeypatch, kwargs, call):
    ref, ours = _pair(**kwargs)

    def fail(*args, **kw):
        raise AssertionError("hfai's LSTM must not run for this case")

    monkeypatch.setattr(lstm_mod, "lstm_layer", fail)
    x = torch.randn(5, 2, INPUT, dtype=torch.float64)
    torch.manual_seed(3)
    expected = call(ref, x)
    torch.manual_seed(3)
    assert torch.equal(call(ours, x), expected)


def test_accelerated_case_runs_hfai(monkeypatch):
    calls = []
    original = lstm_mod.lstm_layer
    monkeypatch.setattr(lstm_mod, "lstm_layer", lambda *a: calls.append(1) or original(*a))
    _, ours = _pair(num_layers=2, bidirectional=True)
    ours(torch.randn(3, 2, INPUT, dtype=torch.float64))
    assert len(calls) == 4


def test_wrong_hidden_shape_raises_torch_error():
    _, ours = _pair(num_layers=2)
    x = torch.randn(3, 2, INPUT, dtype=torch.float64)
    bad = torch.zeros(1, 2, HIDDEN, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="Expected hidden"):
        ours(x, (bad, bad))


def test_cpu_runs_torch_by_default(monkeypatch):
    monkeypatch.setattr(lstm_mod, "_ROUTE_CPU", False)
    monkeypatch.setattr(lstm_mod, "lstm_layer", lambda *a: pytest.fail("hfai route ran on CPU"))
    ref, ours = _pair(torch.float32, num_layers=2)
    x = torch.randn(4, 2, INPUT)
    assert torch.equal(ours(x)[0], ref(x)[0])


def test_state_of_another_dtype_goes_to_torch():
    _, ours = _pair(num_layers=1)
    x = torch.randn(3, 2, INPUT, dtype=torch.float64)
    h = torch.zeros(1, 2, HIDDEN, dtype=torch.float32)
    with pytest.raises(RuntimeError):  # torch's own dtype check, not a silent conversion
        ours(x, (h, h))
