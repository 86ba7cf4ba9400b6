"""haiscale.pipeline: partition/SequentialModel units, and GPipe, PipeDream and Interleaved1F1B
on real gloo ranks against the same model run whole on one process.

Tolerance: the pipeline computes exactly the reference's float32 operations per micro-batch, but
gradients arrive as a sum over micro-batches accumulated stage by stage (and, with DDP, averaged
across ranks), so summation order may differ: a few float32 ulps relative to values of order 1,
hence rtol=1e-5, atol=1e-6. A wrong schedule, a missing micro-batch or a mis-scaled loss are off
by whole percents.
"""

from __future__ import annotations

import pytest
import torch
from haiscale.pipeline import (
    GPipe,
    Interleaved1F1B,
    MicroBatchError,
    PartitionError,
    PipeDream,
    SequentialModel,
    make_subgroups,
    partition,
)
from test_reduce_harness import assert_all_ok, run_ranks
from torch import nn

RTOL, ATOL = 1e-5, 1e-6
CHUNKS = 4


# --- units: no process group -----------------------------------------------------------------


def _mlp(n=8, width=6, seed=0):
    torch.manual_seed(seed)
    return SequentialModel(*[nn.Sequential(nn.Linear(width, width), nn.Tanh()) for _ in range(n)])


def test_partition_balance_keeps_layer_names_and_order():
    model = _mlp(n=7)
    parts = [partition(model, r, 3, balance=[3, 2, 2]) for r in range(3)]
    assert [list(p._modules) for p in parts] == [["0", "1", "2"], ["3", "4"], ["5", "6"]]
    assert parts[1][0] is model[3]  # the same layer objects, not copies
    x = torch.randn(2, 6)
    torch.testing.assert_close(parts[2](parts[1](parts[0](x))), model(x), rtol=0, atol=0)


def test_partition_even_split_gives_earlier_parts_the_extra_layers():
    sizes = [len(partition(_mlp(n=10), r, 4)) for r in range(4)]
    assert sizes == [3, 3, 2, 2]


def test_partition_num_model_chunks_returns_the_interleaved_parts():
    model = _mlp(n=8)
    parts = partition(model, 1, 2, num_model_chunks=2)
    # 4 parts of 2 layers; rank 1 holds parts 1 and 3.
    assert [list(p._modules) for p in parts] == [["2", "3"], ["6", "7"]]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"balance": [4, 4]}, "sums to 8, but the model has 6"),
        ({"balance": [6]}, "1 entries"),
        ({"balance": [6, 0]}, "at least one layer"),
        ({"num_model_chunks": 4}, "fewer than the 8 parts"),
    ],
)
def test_partition_rejects_bad_balance(kwargs, message):
    with pytest.raises(PartitionError, match=message):
        partition(_mlp(n=6), 0, 2, **kwargs)


def test_partition_rejects_a_non_sequential_model():
    with pytest.raises(PartitionError, match="nn.Sequential"):
        partition(nn.Linear(2, 2), 0, 1)


class _Pair(nn.Module):
    def forward(self, x, y):
        return x + y, x * y


def test_sequential_model_unpacks_tuples_between_layers():
    model = SequentialModel(_Pair(), _Pair())
    a, b = torch.tensor([2.0]), torch.tensor([3.0])
    s, p = model(a, b)
    assert (s.item(), p.item()) == (11.0, 30.0)  # (5, 6) -> (11, 30)


# --- models for the distributed checks ---------------------------------------------------------


class _Permute(nn.Module):
    """Takes (x, idx) and passes idx on: an integer activation the next stage indexes with, which
    an uninitialised probe tensor would make out of range."""

    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x, idx):
        y = torch.tanh(self.lin(x))
        return torch.gather(y, 1, idx.unsqueeze(-1).expand_as(y)), idx


class _Norm(nn.Module):
    """BatchNorm over (x, idx): running statistics that a probe must leave as they were."""

    def __init__(self, width):
        super().__init__()
        self.bn = nn.BatchNorm1d(width)

    def forward(self, x, idx):
        return self.bn(x.transpose(1, 2)).transpose(1, 2), idx


class _Head(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.lin = nn.Linear(width, 3)

    def forward(self, x, idx):
        return self.lin(x).sum(1)


def _graph_model(seed=0):
    torch.manual_seed(seed)
    return SequentialModel(_Permute(5), _Permute(5), _Norm(5), _Permute(5), _Head(5))


def _graph_batch(step, batch=8, nodes=4):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randn(batch, nodes, 5, generator=g)
    idx = torch.stack([torch.randperm(nodes, generator=g) for _ in range(batch)])
    return (x, idx), torch.randn(batch, 3, generator=g)


def _mlp_batch(step, batch=8):
    g = torch.Generator().manual_seed(200 + step)
    return (torch.randn(batch, 6, generator=g),), torch.randn(batch, 6, generator=g)


def _criterion(out, y):
    # Mean within a micro-batch, divided by chunks as haiscale scripts do (GPTLoss(chunks)):
    # the sum over micro-batches is then the full batch's mean.
    return ((out - y) ** 2).mean() / CHUNKS


def _reference_step(model, inputs, y):
    """What forward_backward means: criterion summed over micro-batches, run in order."""
    losses = []
    for i in range(CHUNKS):
        mb = [t.chunk(CHUNKS)[i] for t in inputs]
        loss = _criterion(model(*mb), y.chunk(CHUNKS)[i])
        loss.backward()
        losses.append(loss.detach())
    return torch.stack(losses)


def _train_both(pipe, parts, ref, batches, steps=2):
    """Two SGD steps on the pipeline and on the reference; returns the max differences seen."""
    opt_p = torch.optim.SGD([p for part in parts for p in part.parameters()], lr=0.1)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    worst = {"loss": 0.0, "grad": 0.0, "param": 0.0, "buffer": 0.0}
    for step in range(steps):
        inputs, y = batches(step)
        loss, outputs = pipe.forward_backward(*inputs, criterion=_criterion, labels=(y,))
        ref_loss = _reference_step(ref, inputs, y)
        assert outputs is None
        if pipe.is_last_stage:
            assert loss.shape == (CHUNKS,)
            torch.testing.assert_close(loss, ref_loss, rtol=RTOL, atol=ATOL)
            worst["loss"] = max(worst["loss"], (loss - ref_loss).abs().max().item())
        else:
            assert loss is None
        _compare(parts, ref, worst, "grad")
        opt_p.step()
        opt_r.step()
        opt_p.zero_grad()
        opt_r.zero_grad()
    _compare(parts, ref, worst, "param")
    return worst


def _compare(parts, ref, worst, what):
    ref_params = dict(ref.named_parameters())
    ref_buffers = dict(ref.named_buffers())
    for part in parts:
        for name, p in part.named_parameters():
            mine, theirs = (p.grad, ref_params[name].grad) if what == "grad" else (p, ref_params[name])
            torch.testing.assert_close(mine, theirs, rtol=RTOL, atol=ATOL, msg=f"{what} of {name}")
            worst[what] = max(worst[what], (mine - theirs).abs().max().item())
        for name, b in part.named_buffers():
            torch.testing.assert_close(b, ref_buffers[name], rtol=RTOL, atol=ATOL, msg=f"buffer {name}")
            if b.is_floating_point():
                worst["buffer"] = max(worst["buffer"], (b - ref_buffers[name]).abs().max().item())


def _check_eval(pipe, model, ref, batch):
    """Forward only, in eval mode, with a batch size not seen in training (a new signature)."""
    model.eval()
    ref.eval()
    (x,), _ = _mlp_batch(9, batch=batch)
    with torch.no_grad():
        out = pipe(x)
        expected = ref(x)
    model.train()
    ref.train()
    if not pipe.is_last_stage:
        assert out is None
        return 0.0
    torch.testing.assert_close(out, expected, rtol=RTOL, atol=ATOL)
    return (out - expected).abs().max().item()


def _schedules(rank, world):
    """Every schedule on ``world`` ranks against the whole model: returns each one's worst diffs."""
    results = {}

    model, ref = _mlp(), _mlp()
    stage = partition(model, rank, world)
    pipe = GPipe(stage, CHUNKS, checkpoint="except_last")
    results["gpipe"] = _train_both(pipe, [stage], ref, _mlp_batch)
    results["gpipe_eval"] = _check_eval(pipe, stage, ref, batch=CHUNKS * 3)

    model, ref = _graph_model(), _graph_model()
    balance = [2, 3] if world == 2 else [1, 1, 2, 1]
    stage = partition(model, rank, world, balance=balance)
    results["pipedream"] = _train_both(PipeDream(stage, CHUNKS), [stage], ref, _graph_batch)

    model, ref = _mlp(), _mlp()
    parts = partition(model, rank, world, num_model_chunks=2)
    pipe = Interleaved1F1B(parts, CHUNKS)
    results["interleaved"] = _train_both(pipe, parts, ref, _mlp_batch)
    # module holds the rank's chunks as a ModuleList (scripts save pipe.module.state_dict()).
    assert len(pipe.module) == 2 and pipe.module[1] is parts[1]

    with pytest.raises(MicroBatchError, match="chunks=4"):
        pipe.forward_backward(torch.randn(6, 6), criterion=_criterion, labels=(torch.randn(6, 6),))
    return results


@pytest.mark.slow  # two spawned ranks importing torch: 10-15 s on a loaded 2-core machine
@pytest.mark.timeout(120)
def test_two_stage_schedules_match_the_whole_model():
    for worst in assert_all_ok(run_ranks(_schedules, 2, deadline_s=100)):
        # Real numbers came back from every check (the assertions ran inside the ranks).
        assert set(worst) == {"gpipe", "gpipe_eval", "pipedream", "interleaved"}
        assert worst["pipedream"]["grad"] < ATOL * 10 and worst["pipedream"]["buffer"] < ATOL * 10


def _dp_and_pp(rank, world):
    """make_subgroups(pp_size=2) on 4 ranks, haiscale DDP under PipeDream, against the whole model
    fed both data-parallel ranks' batches."""
    import torch.distributed as dist
    from haiscale.ddp import DistributedDataParallel

    dp_group, pp_group = make_subgroups(pp_size=2)
    assert (pp_group.rank(), pp_group.size(), dp_group.rank(), dp_group.size()) == (rank % 2, 2, rank // 2, 2)
    model, ref = _mlp(), _mlp()
    stage = partition(model, pp_group.rank(), pp_group.size())
    ddp = DistributedDataParallel(stage, process_group=dp_group)
    pipe = PipeDream(ddp, CHUNKS, process_group=pp_group)
    opt = torch.optim.SGD(pipe.parameters(), lr=0.1)
    opt_r = torch.optim.SGD(ref.parameters(), lr=0.1)
    for step in range(2):
        inputs, y = _mlp_batch(10 * step + dp_group.rank())
        pipe.forward_backward(*inputs, criterion=_criterion, labels=(y,))
        for d in range(2):  # DDP averages the two data-parallel ranks' gradients
            (x_d,), y_d = _mlp_batch(10 * step + d)
            for i in range(CHUNKS):
                (_criterion(ref(x_d.chunk(CHUNKS)[i]), y_d.chunk(CHUNKS)[i]) / 2).backward()
        worst = {"grad": 0.0, "param": 0.0, "buffer": 0.0}
        _compare([stage], ref, worst, "grad")
        opt.step()
        opt_r.step()
        opt.zero_grad()
        opt_r.zero_grad()
    _compare([stage], ref, worst, "param")
    ddp.reducer.stop()
    dist.barrier()
    return worst


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_four_stage_schedules_match_the_whole_model():
    for worst in assert_all_ok(run_ranks(_schedules, 4, deadline_s=180)):
        assert worst["interleaved"]["grad"] < ATOL * 10


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ddp_under_pipedream_with_make_subgroups_matches_the_whole_model():
    for worst in assert_all_ok(run_ranks(_dp_and_pp, 4, deadline_s=180)):
        assert worst["grad"] < ATOL * 10
