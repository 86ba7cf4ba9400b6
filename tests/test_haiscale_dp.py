"""haiscale.ddp and haiscale.fsdp on two real gloo ranks against one process training on both
ranks' batches: the wrappers must average gradients exactly as the full batch's mean does.

Tolerance rtol=1e-5, atol=1e-6: float32 sums of the two ranks' gradients in another order than
the full-batch backward, a few ulps; a missing or doubled reduction is off by a factor of two.
"""

from __future__ import annotations

import functools

import pytest
import torch
from test_reduce_harness import assert_all_ok, run_ranks
from torch import nn

RTOL, ATOL = 1e-5, 1e-6


def _net(seed):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def _batch(rank, step):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def _reference(steps):
    ref = _net(0)
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(steps):
        xs, ys = zip(*(_batch(r, step) for r in range(2)), strict=True)
        nn.functional.mse_loss(ref(torch.cat(xs)), torch.cat(ys)).backward()
        opt.step()
        opt.zero_grad()
    return ref


def _train(model, rank, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x, y = _batch(rank, step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()


def _max_diff(a: nn.Module, b: nn.Module) -> float:
    worst = 0.0
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=RTOL, atol=ATOL, msg=name)
        worst = max(worst, (p - q).abs().max().item())
    return worst


def _both(rank, world):
    from haiscale.ddp import DistributedDataParallel
    from haiscale.fsdp import BackwardPrefetch, FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    ref = _reference(steps=3)
    out = {}

    # Each rank starts from different weights: the wrapper must broadcast rank 0's.
    ddp = DistributedDataParallel(_net(rank), device_ids=[rank])
    _train(ddp, rank, steps=3)
    out["ddp"] = _max_diff(ddp.module, ref)
    ddp.reducer.stop()
    ddp.reducer.stop()  # idempotent, as scripts may call it on every exit path

    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=500)
    fsdp = FullyShardedDataParallel(_net(0), auto_wrap_policy=policy, backward_prefetch=BackwardPrefetch.BACKWARD_POST)
    # Sharded: each rank holds about half of each flat parameter.
    local = sum(p.numel() for p in fsdp.parameters())
    assert local < sum(p.numel() for p in ref.parameters())
    _train(fsdp, rank, steps=3)
    with fsdp.summon_full_params():  # on the instance, as hfai scripts call it
        out["fsdp"] = _max_diff(fsdp.module, ref)
    with FullyShardedDataParallel.summon_full_params(fsdp):  # torch's static form still works
        out["fsdp_static"] = _max_diff(fsdp.module, ref)
    return out


@pytest.mark.slow  # two spawned ranks importing torch: 10-15 s on a loaded 2-core machine
@pytest.mark.timeout(120)
def test_ddp_and_fsdp_match_full_batch_training():
    for worst in assert_all_ok(run_ranks(_both, 2, deadline_s=100)):
        assert set(worst) == {"ddp", "fsdp", "fsdp_static"}
        assert max(worst.values()) < 1e-5
