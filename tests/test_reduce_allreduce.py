"""hfai.reduce all-reduce on real local ranks: results equal torch.distributed's, errors are
typed, a dead or stuck rank makes the others raise, and no shared-memory segment remains."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist
from test_reduce_harness import assert_all_ok, no_leaked_segments, run_ranks  # noqa: F401

import hfai.reduce as R

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90), pytest.mark.usefixtures("no_leaked_segments")]

#: fp16/bf16 are summed in fp32 then rounded once: one rounding of the result's magnitude.
TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=8e-3, atol=8e-3),
}


def _group(rank, world, nodes, **config):
    config.setdefault("timeout_s", 20)
    return R.init(config=R.ReduceConfig(**config), node_key=f"node{rank * nodes // world}")


def _reference(x: torch.Tensor) -> torch.Tensor:
    """Sum over ranks with torch.distributed, in fp32/fp64, then rounded like ours."""
    wide = x.to(torch.float64, copy=True)  # never alias x: float64 .double() returns x itself
    dist.all_reduce(wide)
    return wide.to(x.dtype)


SHAPES = [(0,), (1,), (7,), (3, 5), (4097,), (3, 1000, 3)]


def _matches_torch(rank, world, nodes, shapes, mismatch_kinds):
    # A small slot (16 KiB) forces multi-chunk transfers even for these modest sizes.
    group = _group(rank, world, nodes, capacity_bytes=16 * 1024)
    assert group.topo.num_nodes == nodes
    checked = 0
    for shape in shapes:
        for dtype in TOL:
            for op in R.ReduceOp:
                g = torch.Generator().manual_seed(rank * 1000 + shape[0])
                x = torch.randn(shape, generator=g).to(dtype)
                expected = _reference(x)
                if op is R.ReduceOp.AVG:
                    expected = (expected.double() / world).to(dtype)
                out = R.allreduce(x, op)
                assert out is x and x.shape == shape and x.dtype == dtype
                torch.testing.assert_close(x, expected, **TOL[dtype])
                checked += 1
    # A leaf that requires grad is reduced in place, as torch.distributed does.
    w = torch.nn.Parameter(torch.full((3,), float(rank)))
    R.allreduce(w)
    assert w.tolist() == [float(sum(range(world)))] * 3 and w.requires_grad
    # Non-contiguous input is reduced in place too.
    base = torch.full((6, 4), float(rank + 1))
    R.allreduce(base.t())
    assert torch.equal(base, torch.full((6, 4), float(sum(range(1, world + 1)))))
    # Several tensors of mixed dtypes in one call.
    ts = [torch.full((3,), 1.0, dtype=torch.bfloat16), torch.full((5, 2), 2.0),
          torch.full((1,), 3.0, dtype=torch.float64), torch.empty(0)]
    R.allreduce_coalesced(ts)
    assert [t.tolist() for t in ts[:3]] == [[world * 1.0] * 3, [[world * 2.0] * 2] * 5, [world * 3.0]]
    R.destroy()
    _shared_buffer(rank, world, nodes)
    return checked, _mismatches(rank, world, mismatch_kinds)


# Spawning ranks dominates these tests' time, so one spawn checks results, the shared buffer
# and then (each on a fresh group, since a mismatch aborts its group) the mismatch errors.
# Two simulated nodes of two ranks oversubscribe a 2-core machine: fewer shapes there.
@pytest.mark.parametrize(
    "world,nodes,shapes,kinds,errors",
    [
        (2, 1, SHAPES, ["numel", "empty", "dtype"], [["SizeMismatchError"] * 3] * 2),
        # Leaders see the nodes disagree; their local ranks learn it from the aborted arena.
        (4, 2, SHAPES[::2], ["numel-across-nodes"],
         [["SizeMismatchError"], ["GroupAbortedError"]] * 2),
    ],
)
def test_allreduce_matches_torch_and_mismatches_raise(world, nodes, shapes, kinds, errors):
    values = assert_all_ok(run_ranks(_matches_torch, world, nodes, shapes, kinds))
    assert [v[0] for v in values] == [len(shapes) * 4 * 2] * world
    assert [v[1] for v in values] == errors


def _shared_buffer(rank, world, nodes):
    """allreduce_shared: in place in the shared buffer, no copies; then close()."""
    group = _group(rank, world, nodes, capacity_bytes=64 * 1024)
    buf = group.shared_buffer()
    assert buf.numel() == group.capacity_bytes
    f32 = buf.view(torch.float32)
    f32.fill_(rank + 1.0)
    view = f32[33:5000]  # odd offset and length: slices of the ranks start mid-line
    group.allreduce_shared(view, R.ReduceOp.AVG)
    assert torch.all(view == sum(range(1, world + 1)) / world)
    assert f32[32] == rank + 1 and f32[5000] == rank + 1  # outside the view: untouched
    f64 = buf[8192:16384].view(torch.float64)
    f64.fill_(0.5)
    group.allreduce_shared(f64)
    assert torch.all(f64 == 0.5 * world)
    with pytest.raises(R.CapacityError):
        group.allreduce_shared(torch.zeros(4))
    with pytest.raises(R.UnsupportedTensorError):
        group.allreduce_shared(buf[:64].view(torch.float16))
    group.close()
    group.close()
    with pytest.raises(R.GroupClosedError):
        group.allreduce(torch.zeros(2))


def _mismatches(rank, world, kinds):
    """Each kind on a fresh group (a mismatch aborts the group); returns the error names."""
    seen = []
    for kind in kinds:
        try:
            _mismatch(rank, world, kind)
            seen.append("no error")
        except R.ReduceError as e:
            assert "disagree" in str(e) or isinstance(e, R.GroupAbortedError), e
            seen.append(type(e).__name__)
    return seen


def _mismatch(rank, world, kind):
    group = _group(rank, world, 2 if kind == "numel-across-nodes" else 1)
    if kind == "numel":
        x = torch.zeros(10 + rank)
    elif kind == "empty":
        x = torch.zeros(0 if rank else 10)
    elif kind == "dtype":
        x = torch.zeros(10, dtype=torch.float16 if rank else torch.float32)
    else:  # numel-across-nodes: ranks agree inside each node, the nodes disagree
        x = torch.zeros(10 if rank < world // 2 else 12)
    try:
        group.allreduce(x)
    except R.ReduceError as e:
        # The group is unusable afterwards, and says so.
        with pytest.raises(R.GroupAbortedError):
            group.allreduce(torch.zeros(1))
        raise e
    return "no error"


def test_unsupported_dtype_and_missing_init_raise_typed_errors():
    assert not dist.is_initialized()
    with pytest.raises(R.NotInitializedError):
        R.allreduce(torch.zeros(3))
    with pytest.raises(R.UnsupportedTensorError, match="int64"):
        R.group._validate(torch.zeros(3, dtype=torch.int64))
    assert issubclass(R.PeerDiedError, R.PeerError) and issubclass(R.PeerError, R.ReduceError)
    assert issubclass(R.SizeMismatchError, ValueError)


def _on_cpu(rank, world, nodes, machine):
    """Make a group while platform.machine() reports ``machine``; its sum, or the error's type."""
    import platform

    platform.machine = lambda: machine  # this spawned rank's own module: nothing else sees it
    try:
        x = torch.full((5,), float(rank + 1))
        _group(rank, world, nodes).allreduce(x)
        return x.tolist()
    except R.ReduceError as e:
        return type(e).__name__
    finally:
        R.destroy()


@pytest.mark.parametrize("machine", ["aarch64", "ppc64le"])
def test_shared_arena_refused_on_weakly_ordered_cpus(machine):
    # Two ranks on one node would share the arena: refused on every rank, before any reduction.
    assert assert_all_ok(run_ranks(_on_cpu, 2, 1, machine)) == ["UnsupportedPlatformError"] * 2
    # One rank per node shares nothing in memory: allowed, and the sum is right.
    assert assert_all_ok(run_ranks(_on_cpu, 2, 2, machine)) == [[3.0] * 5] * 2


def test_shared_arena_allowed_on_x86_64():
    assert assert_all_ok(run_ranks(_on_cpu, 2, 1, "x86_64")) == [[3.0] * 5] * 2


def _killed_mid_reduction(rank, world, nodes, victim):
    group = _group(rank, world, nodes, timeout_s=60)
    x = torch.ones(1 << 20)
    group.allreduce(x)
    if rank == victim:
        # Die at an arbitrary point inside the loop below, as a crashed process would.
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGKILL)).start()
    for _ in range(100_000):
        x.fill_(1.0)
        group.allreduce(x)
    return "finished"


def test_dead_rank_makes_peer_raise_before_timeout():
    # timeout_s is 60 and the test's own limit lower: PeerDiedError proves liveness caught it.
    out = run_ranks(_killed_mid_reduction, 2, 1, 1, deadline_s=40)
    assert out[1].error_type == "exit" and out[1].exitcode == -signal.SIGKILL
    assert out[0].error_type == "PeerDiedError", out[0].message


def test_dead_rank_on_one_node_fails_the_other_node():
    out = run_ranks(_killed_mid_reduction, 4, 2, 3, deadline_s=60)
    assert out[3].error_type == "exit"
    assert out[2].error_type == "PeerDiedError", out[2].message
    # The other node learns it through its leader's failed inter-node all-reduce.
    assert out[0].error_type == "InterNodeError", out[0].message
    assert out[1].error_type == "GroupAbortedError", out[1].message


def _stuck(rank, world):
    group = _group(rank, world, 1, timeout_s=1.0)
    if rank == 1:
        time.sleep(2.5)  # alive but not taking part: only the timeout can catch this
    try:
        group.allreduce(torch.ones(8))
    except R.ReduceError as e:
        return type(e).__name__
    return "no error"


def test_stuck_rank_times_out_and_aborts_the_group():
    values = assert_all_ok(run_ranks(_stuck, 2))
    assert values == ["PeerTimeoutError", "GroupAbortedError"]
