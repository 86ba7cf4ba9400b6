"""hfai.reduce with CUDA tensors: page-locked arena, device copies on a side stream, results equal
to torch.distributed's on the host. Skipped without a CUDA device.

Two ranks share one GPU (a lent test machine has one), so the inter-node step stays on gloo; the
NCCL inter-node backend needs a GPU per rank and is not covered here.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from test_reduce_harness import assert_all_ok, no_leaked_segments, run_ranks  # noqa: F401
from torch import nn

import hfai.reduce as R

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.timeout(120),
    pytest.mark.usefixtures("no_leaked_segments"),
]

TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=8e-3, atol=8e-3),
}


def _host_sum(x: torch.Tensor) -> torch.Tensor:
    """The reference: the same tensor summed over ranks by gloo on the host, in float64."""
    wide = x.detach().to("cpu", torch.float64, copy=True)
    dist.all_reduce(wide)
    return wide.to(x.dtype)


def _cuda_allreduce(rank, world, nodes):
    # 64 KiB slots force several chunks through the page-locked arena for the larger sizes.
    R.init(config=R.ReduceConfig(timeout_s=20, capacity_bytes=64 * 1024),
           node_key=f"node{rank * nodes // world}")  # fmt: skip
    checked = 0
    for dtype in TOL:
        for shape in [(1,), (7, 3), (3, 1000, 3), (1 << 18,)]:
            g = torch.Generator().manual_seed(rank * 100 + len(shape))
            x = torch.randn(shape, generator=g).to(dtype).cuda()
            expected = _host_sum(x)
            strided = x.t() if x.dim() == 2 else x  # non-contiguous input goes through a copy
            out = R.allreduce(strided)
            assert out is strided and out.is_cuda and out.dtype == dtype
            torch.testing.assert_close(x.cpu(), expected, **TOL[dtype])
            checked += 1
    pinned = R.get_group()._pinned
    R.destroy()
    return checked, pinned


@pytest.mark.parametrize("nodes", [1, 2])
def test_cuda_tensors_match_host_sum(nodes):
    values = assert_all_ok(run_ranks(_cuda_allreduce, 2, nodes, deadline_s=100))
    assert values == [(12, True)] * 2  # every case checked, arena page-locked on both ranks


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(13, 32)
        self.b = nn.Linear(32, 5).to(torch.bfloat16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)).to(torch.bfloat16)).float()


def _cuda_ddp(rank, world, steps):
    torch.manual_seed(0)
    host = _Net()
    model = R.DistributedDataParallel(
        copy.deepcopy(host).cuda(), reduce_config=R.ReduceConfig(timeout_s=20)
    )
    for step in range(steps):
        g = torch.Generator().manual_seed(rank * 10 + step)
        x, y = torch.randn(8, 13, generator=g), torch.randn(8, 5, generator=g)
        model.zero_grad(set_to_none=step % 2 == 0)
        nn.functional.mse_loss(model(x.cuda()), y.cuda()).backward()
        host.zero_grad()
        nn.functional.mse_loss(host(x), y).backward()
        for (name, mine), theirs in zip(host.named_parameters(), model.module.parameters(), strict=True):
            expected = (_host_sum(mine.grad).double() / world).to(mine.dtype)
            assert theirs.grad.is_cuda and theirs.grad.dtype == mine.dtype
            tol = TOL.get(mine.dtype, TOL[torch.float32])
            # Host and device compute the local gradients in different orders: bf16 rounding.
            tol = {k: 4 * v for k, v in tol.items()}
            torch.testing.assert_close(theirs.grad.cpu(), expected, **tol, msg=f"{step} {name}")
        with torch.no_grad():  # keep the host copy on the same weights as the device one
            for mine, theirs in zip(host.parameters(), model.module.parameters(), strict=True):
                mine.copy_(theirs.cpu())
    model.close()
    return steps


def test_cuda_ddp_gradients_are_the_rank_average():
    assert assert_all_ok(run_ranks(_cuda_ddp, 2, 3, deadline_s=100)) == [3, 3]
