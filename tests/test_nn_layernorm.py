"""hfai.nn.LayerNorm on CPU: it is torch's kernel there, so results must be bit-identical.

(The fused Triton kernels are tested in test_nn_triton.py and, on a GPU, test_nn_gpu.py.)
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import hfai.nn


@pytest.mark.parametrize(
    "shape,kwargs",
    [
        ((3, 7, 33), {}),
        ((2, 5, 4, 6), dict(normalized_shape=(4, 6))),
        ((4, 33), dict(elementwise_affine=False)),
        ((4, 33), dict(bias=False)),
        ((4, 33), dict(eps=1e-3)),
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_identical_to_torch_on_cpu(shape, kwargs, dtype):
    normalized = kwargs.pop("normalized_shape", shape[-1])
    torch.manual_seed(0)
    ref = torch.nn.LayerNorm(normalized, dtype=dtype, **kwargs)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_()
    ours = hfai.nn.LayerNorm(normalized, dtype=dtype, **kwargs)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    results = []
    for m in (ref, ours):
        x.grad = None
        y = m(x)
        y.backward(torch.ones_like(y).normal_(generator=torch.Generator().manual_seed(1)))
        results.append([y, x.grad, *(p.grad for p in m.parameters())])
    for got, expected in zip(results[1], results[0], strict=True):
        assert torch.equal(got, expected)
    assert list(ours.state_dict()) == list(ref.state_dict())


def test_functional_matches_torch():
    x = torch.randn(3, 10)
    w, b = torch.randn(10), torch.randn(10)
    assert torch.equal(hfai.nn.functional.layer_norm(x, (10,), w, b), F.layer_norm(x, (10,), w, b))
    assert torch.equal(hfai.nn.functional.layer_norm(x, [10]), F.layer_norm(x, (10,)))


def test_bad_shape_raises_torch_error():
    with pytest.raises(RuntimeError):
        hfai.nn.LayerNorm(5)(torch.randn(3, 4))
