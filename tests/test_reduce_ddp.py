"""hfai.reduce.DistributedDataParallel against torch's DDP on real local ranks."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from test_reduce_harness import assert_all_ok, no_leaked_segments, run_ranks  # noqa: F401
from torch import nn

import hfai.reduce as R

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120), pytest.mark.usefixtures("no_leaked_segments")]

CONFIG = R.ReduceConfig(timeout_s=20)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(13, 32)
        self.norm = nn.BatchNorm1d(32)  # a buffer that DDP broadcasts
        self.b = nn.Linear(32, 5)
        self.spare = nn.Linear(5, 5)  # used only when asked: an unused parameter otherwise

    def forward(self, x, use_spare=False):
        y = self.b(torch.relu(self.norm(self.a(x))))
        return self.spare(y) if use_spare else y


class Mixed(nn.Module):
    def __init__(self, half: torch.dtype):
        super().__init__()
        self.low = nn.Linear(64, 33).to(half)
        self.single = nn.Linear(33, 9)
        self.wide = nn.Linear(9, 3).double()

    def forward(self, x):
        y = self.low(x.to(self.low.weight.dtype)).float()
        return self.wide(self.single(y).double())


def _pair(rank, world, nodes, **kwargs):
    torch.manual_seed(1234 + rank)  # different init per rank: DDP must broadcast rank 0's
    ref = Net()
    ours = copy.deepcopy(ref)
    node = f"node{rank * nodes // world}"
    ddp_t = nn.parallel.DistributedDataParallel(ref, **kwargs)
    # A small bucket cap gives several buckets, reduced in order by the communication thread.
    ddp_h = R.DistributedDataParallel(
        ours, bucket_cap_mb=0.002, reduce_config=CONFIG, node_key=node, **kwargs
    )
    return ddp_t, ddp_h


def _batch(rank, step, n=8):
    g = torch.Generator().manual_seed(rank * 100 + step)
    return torch.randn(n, 13, generator=g), torch.randn(n, 5, generator=g)


def _assert_same(a: nn.Module, b: nn.Module, what: str) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=f"{what}: {name}")
        if p.grad is None:
            assert q.grad is None, f"{what}: {name} grad should be None"
        else:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-6, msg=f"{what}: {name}.grad")
    for (name, x), y in zip(a.named_buffers(), b.buffers(), strict=True):
        torch.testing.assert_close(y, x, msg=f"{what}: buffer {name}")


def _train_parity(rank, world, nodes, steps):
    ddp_t, ddp_h = _pair(rank, world, nodes)
    _assert_same(ddp_t.module, ddp_h.module, "after construction")
    opt_t = torch.optim.SGD(ddp_t.parameters(), lr=0.1, momentum=0.9)
    opt_h = torch.optim.SGD(ddp_h.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        x, y = _batch(rank, step)
        for model, opt in ((ddp_t, opt_t), (ddp_h, opt_h)):
            # Alternate zeroing styles: set_to_none copies into shared memory, zeroing in place
            # accumulates straight into it.
            opt.zero_grad(set_to_none=step % 2 == 0)
            nn.functional.mse_loss(model(x, use_spare=True), y).backward()
        _assert_same(ddp_t.module, ddp_h.module, f"grads of step {step}")
        opt_t.step()
        opt_h.step()
    _assert_same(ddp_t.module, ddp_h.module, f"after {steps} steps")
    # Gradients of fp32 CPU parameters live in the shared arena.
    shared = ddp_h._group.shared_buffer()
    lo, hi = shared.data_ptr(), shared.data_ptr() + shared.numel()
    assert all(lo <= p.grad.data_ptr() < hi for p in ddp_h.module.a.parameters())
    ddp_h.close()
    ddp_h.close()
    return True


@pytest.mark.parametrize("world,nodes,steps", [(2, 1, 5), (4, 2, 3)])
def test_training_matches_torch_ddp(world, nodes, steps):
    assert_all_ok(run_ranks(_train_parity, world, nodes, steps))


def _modes(rank, world):
    """no_sync accumulation, manual sync_grad, unused parameters, half precision."""
    # no_sync: two micro-batches, the first not synchronised.
    ddp_t, ddp_h = _pair(rank, world, 1)
    for model in (ddp_t, ddp_h):
        x0, y0 = _batch(rank, 0)
        x1, y1 = _batch(rank, 1)
        with model.no_sync():
            nn.functional.mse_loss(model(x0, use_spare=True), y0).backward()
        nn.functional.mse_loss(model(x1, use_spare=True), y1).backward()
    _assert_same(ddp_t.module, ddp_h.module, "no_sync")
    ddp_h.close()

    # Manual mode: nothing is reduced during backward; sync_grad() does it.
    torch.manual_seed(7)
    local = Net()
    ddp_m = R.DistributedDataParallel(copy.deepcopy(local), auto_sync=False, reduce_config=CONFIG)
    ddp_r = nn.parallel.DistributedDataParallel(local)
    x, y = _batch(rank, 3)
    nn.functional.mse_loss(ddp_m(x, use_spare=True), y).backward()
    before = ddp_m.module.a.weight.grad.clone()
    others = [torch.empty_like(before) for _ in range(world)]
    dist.all_gather(others, before)
    assert not all(torch.equal(o, before) for o in others)  # still local
    ddp_m.sync_grad()
    nn.functional.mse_loss(ddp_r(x, use_spare=True), y).backward()
    _assert_same(ddp_r.module, ddp_m.module, "sync_grad")
    ddp_m.close()

    # Unused parameters: 'spare' is used by rank 0 only; torch's find_unused semantics.
    ddp_t, ddp_h = _pair(rank, world, 1, find_unused_parameters=True)
    for model in (ddp_t, ddp_h):
        x, y = _batch(rank, 4)
        nn.functional.mse_loss(model(x, use_spare=rank == 0), y).backward()
    assert ddp_h.module.spare.weight.grad is not None  # averaged with rank 1's zeros
    _assert_same(ddp_t.module, ddp_h.module, "unused on one rank")
    ddp_h.close()
    # ... and used by nobody: its grad stays None, as with torch.
    ddp_t, ddp_h = _pair(rank, world, 1, find_unused_parameters=True)
    for model in (ddp_t, ddp_h):
        x, y = _batch(rank, 5)
        nn.functional.mse_loss(model(x), y[:, :5]).backward()
    assert ddp_h.module.spare.weight.grad is None
    _assert_same(ddp_t.module, ddp_h.module, "unused everywhere")
    ddp_h.close()

    # Mixed dtypes in one model: fp16/bf16 summed in fp32 and rounded once, fp64 in fp64.
    for half in (torch.float16, torch.bfloat16):
        torch.manual_seed(11)
        local = Mixed(half)
        ddp = R.DistributedDataParallel(copy.deepcopy(local), reduce_config=CONFIG)
        x = torch.randn(4, 64, generator=torch.Generator().manual_seed(rank))
        ddp(x).pow(2).sum().backward()
        local(x).pow(2).sum().backward()
        for (name, mine), theirs in zip(local.named_parameters(), ddp.module.parameters(), strict=True):
            expected = mine.grad.double()
            dist.all_reduce(expected)
            expected = (expected / world).to(mine.dtype)
            assert theirs.grad.dtype == mine.dtype
            tol = {torch.float16: 2e-3, torch.bfloat16: 1e-2}.get(mine.dtype, 1e-6)
            torch.testing.assert_close(theirs.grad, expected, rtol=tol, atol=tol, msg=name)
        ddp.close()
    return True


def test_no_sync_manual_unused_and_half_precision():
    assert_all_ok(run_ranks(_modes, 2))


def _size_mismatch(rank, world):
    model = nn.Linear(4, 3 + rank)  # ranks disagree on the model
    ddp = R.DistributedDataParallel(model, init_sync=False, reduce_config=CONFIG)
    errors = []
    for _ in range(2):  # the error surfaces from backward(); after it the wrapper is unusable
        try:
            ddp(torch.randn(2, 4)).sum().backward()
            errors.append("no error")
        except R.ReduceError as e:
            errors.append(type(e).__name__)
    ddp.close()
    return errors


def test_ranks_with_different_models_raise_size_mismatch():
    values = assert_all_ok(run_ranks(_size_mismatch, 2))
    assert values == [["SizeMismatchError", "GroupAbortedError"]] * 2


def test_hfai_nn_parallel_reexports_ddp():
    from hfai.nn.parallel import DistributedDataParallel

    assert DistributedDataParallel is R.DistributedDataParallel
    with pytest.raises(R.NotInitializedError):
        DistributedDataParallel(nn.Linear(2, 2))
