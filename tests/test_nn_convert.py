"""to_hfai, set_replace_torch and the package surface of hfai.nn."""

from __future__ import annotations

import copy
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import hfai.nn
import hfai.nn.attention
import hfai.nn.lstm


class _Model(torch.nn.Module):
    """A model holding all three supported modules, nested, plus one that must not change."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, num_layers=2, batch_first=True)
        self.block = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.Linear(8, 8))
        self.attn = torch.nn.MultiheadAttention(8, 2, batch_first=True)
        self.norm = torch.nn.LayerNorm(8, bias=False)

    def forward(self, x):
        h, _ = self.lstm(x)
        h = self.block(h)
        a, w = self.attn(h, h, h)
        return self.norm(h + a).sum() + w.sum()


def _outputs_and_grads(model, x):
    model.zero_grad(set_to_none=True)
    loss = model(x)
    loss.backward()
    return [loss] + [p.grad for p in model.parameters()]


def test_to_hfai_same_outputs_and_gradients(monkeypatch):
    # Run hfai's LSTM route on CPU too (by default CPU LSTMs run torch's kernel).
    monkeypatch.setattr(hfai.nn.lstm, "_ROUTE_CPU", True)
    calls = []
    original = hfai.nn.lstm.lstm_layer
    monkeypatch.setattr(hfai.nn.lstm, "lstm_layer", lambda *a: calls.append(1) or original(*a))
    torch.manual_seed(0)
    model = _Model().double()
    reference = copy.deepcopy(model)
    params_before = [id(p) for p in model.parameters()]
    converted = hfai.nn.to_hfai(model)
    assert converted is model
    assert type(model.lstm) is hfai.nn.LSTM
    assert type(model.block[0]) is hfai.nn.LayerNorm
    assert type(model.block[1]) is torch.nn.Linear
    assert type(model.attn) is hfai.nn.MultiheadAttention
    assert type(model.norm) is hfai.nn.LayerNorm
    assert [id(p) for p in model.parameters()] == params_before
    assert list(model.state_dict()) == list(reference.state_dict())
    x = torch.randn(3, 5, 6, dtype=torch.float64)
    for got, expected in zip(_outputs_and_grads(model, x), _outputs_and_grads(reference, x), strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    assert calls, "the converted LSTM did not run hfai's route"


def test_to_hfai_not_inplace_leaves_model_alone():
    model = _Model()
    converted = hfai.nn.to_hfai(model, inplace=False)
    assert type(model.lstm) is torch.nn.LSTM and type(converted.lstm) is hfai.nn.LSTM
    assert converted.lstm.weight_hh_l0 is not model.lstm.weight_hh_l0
    assert torch.equal(converted.lstm.weight_hh_l0, model.lstm.weight_hh_l0)


def test_to_hfai_converts_a_bare_module_keeps_dtype_and_mode():
    module = torch.nn.LayerNorm(4).to(torch.bfloat16).eval()
    converted = hfai.nn.to_hfai(module)
    assert type(converted) is hfai.nn.LayerNorm
    assert converted.weight.dtype == torch.bfloat16 and not converted.training


def test_to_hfai_leaves_subclasses_alone():
    class Custom(torch.nn.LayerNorm):
        def forward(self, x):
            return x

    model = torch.nn.Sequential(Custom(3))
    hfai.nn.to_hfai(model)
    assert type(model[0]) is Custom


def test_to_hfai_verbose_prints_each_swap(capsys):
    hfai.nn.to_hfai(_Model(), verbose=True)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    assert any("attn" in line and "MultiheadAttention" in line for line in lines)
    hfai.nn.to_hfai(_Model())
    assert capsys.readouterr().out == ""


def test_set_replace_torch_patches_and_restores(monkeypatch):
    original = (F.layer_norm, F.multi_head_attention_forward)
    calls = []
    route = hfai.nn.attention.attention
    spy = lambda *a, **k: calls.append(1) or route(*a, **k)  # noqa: E731
    monkeypatch.setattr(hfai.nn.attention, "attention", spy)
    try:
        hfai.nn.functional.set_replace_torch()
        hfai.nn.functional.set_replace_torch()
        assert F.layer_norm is hfai.nn.functional.layer_norm
        assert F.multi_head_attention_forward is hfai.nn.functional.multi_head_attention_forward
        # torch's modules now go through hfai and still give torch's results (and no recursion).
        torch.manual_seed(0)
        mha = torch.nn.MultiheadAttention(8, 2).double()
        x = torch.randn(4, 2, 8, dtype=torch.float64)
        patched = mha(x, x, x)
        ln = torch.nn.LayerNorm(8)(x.float())
    finally:
        hfai.nn.functional.set_replace_torch(False)
    assert calls == [1], "torch's MultiheadAttention did not go through hfai while patched"
    assert (F.layer_norm, F.multi_head_attention_forward) == original
    expected = mha(x, x, x)
    torch.testing.assert_close(patched[0], expected[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(patched[1], expected[1], rtol=1e-10, atol=1e-10)
    assert torch.equal(ln, torch.nn.LayerNorm(8)(x.float()))


@pytest.mark.slow  # a fresh interpreter or more: seconds
def test_parallel_is_lazy_and_reachable():
    code = (
        "import sys, hfai.nn\n"
        "assert 'hfai.nn.parallel' not in sys.modules\n"
        "try:\n"
        "    hfai.nn.parallel\n"
        "except ModuleNotFoundError as e:\n"
        "    assert e.name == 'hfai.nn.parallel', e\n"
        "else:\n"
        "    assert 'hfai.nn.parallel' in sys.modules\n"
        "try:\n"
        "    hfai.nn.no_such_thing\n"
        "except AttributeError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('missing attribute did not raise')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow  # a fresh interpreter or more: seconds
def test_imports_without_triton_and_import_hfai_stays_light():
    code = (
        "import sys\n"
        "sys.modules['triton'] = None  # make 'import triton' fail as if not installed\n"
        "import hfai\n"
        "assert 'torch' not in sys.modules\n"
        "import hfai.nn, torch\n"
        "assert not hfai.nn._backend.use_triton(torch.zeros(1))\n"
        "m = hfai.nn.to_hfai(torch.nn.Sequential(torch.nn.LayerNorm(4), torch.nn.LSTM(4, 4)))\n"
        "m[1](m[0](torch.randn(2, 3, 4)))\n"
        "assert 'hfai.nn.triton_layernorm' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
