"""Single-process tests of hfai.reduce's pure parts and of shared-memory lifetime."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hfai.reduce import buckets as B
from hfai.reduce import kernels, shm, topology
from hfai.reduce import layout as L

# --- layout ------------------------------------------------------------------------------------


@given(st.integers(0, 100_000), st.integers(1, 9), st.sampled_from([2, 4, 8]))
def test_partition_covers_range_once_with_aligned_starts(numel, parts, itemsize):
    ranges = L.partition(numel, parts, itemsize)
    assert len(ranges) == parts
    covered = [i for start, stop in ranges for i in range(start, stop)] if numel < 2000 else None
    if covered is not None:
        assert covered == list(range(numel))
    assert ranges[0][0] == 0 and ranges[-1][1] == numel
    for (_, e0), (s1, _) in itertools.pairwise(ranges):
        assert e0 == s1 or s1 == numel
    for start, stop in ranges:
        assert start == numel or (start * itemsize) % L.SLICE_ALIGN_BYTES == 0
        assert 0 <= start <= stop <= numel


def test_chunks_include_one_empty_chunk_for_empty_tensors():
    assert L.chunks(0, 10) == [(0, 0)]
    assert L.chunks(25, 10) == [(0, 10), (10, 20), (20, 25)]
    with pytest.raises(ValueError):
        L.chunks(5, 0)


def test_arena_layout_offsets_do_not_overlap():
    lay = L.ArenaLayout(nranks=3, slot_bytes=8192)
    assert lay.header_bytes % L.PAGE == 0
    assert lay.rank_word(2, L.R_DESC_OP) * 8 < lay.header_bytes
    assert lay.slot_offset(0) == lay.header_bytes
    assert lay.slot_offset(2) + 8192 == lay.result_offset
    assert lay.total_bytes == lay.result_offset + 8192
    # Each rank's words lie on its own line, away from the global line.
    lines = {lay.rank_word(r, 0) * 8 // L.LINE_BYTES for r in range(3)}
    assert lines == {1, 2, 3}
    with pytest.raises(ValueError):
        L.ArenaLayout(nranks=2, slot_bytes=100)
    with pytest.raises(IndexError):
        lay.slot_offset(3)


# --- topology ----------------------------------------------------------------------------------


def test_topology_groups_ranks_by_key_in_rank_order():
    keys = ["b", "a", "b", "a", "c"]
    t = topology.from_node_keys(keys, 3)
    assert t.node_rank == 1 and t.local_rank == 1 and t.node_members == (1, 3)
    assert t.leaders == (0, 1, 4) and t.num_nodes == 3 and not t.is_leader
    assert topology.from_node_keys(keys, 4).local_size == 1
    assert topology.from_node_keys(["x"] * 4, 0).is_leader


# --- buckets -----------------------------------------------------------------------------------


def test_bucket_assignment_reverse_order_caps_and_dtype_split():
    specs = [B.ParamSpec(100, 4, 0), B.ParamSpec(300, 4, 0), B.ParamSpec(50, 8, 4),
             B.ParamSpec(200, 4, 0), B.ParamSpec(10, 4, 0)]
    buckets = B.assign_buckets(specs, cap_bytes=1200, first_bytes=900)
    order = [i for b in buckets for i in b.params]
    assert sorted(order) == list(range(5))
    assert order == [4, 3, 2, 1, 0]  # reverse registration order
    for b in buckets:
        assert len({specs[i].acc_key for i in b.params}) == 1
        assert b.offset % L.SLICE_ALIGN_BYTES == 0
        assert b.nbytes == sum(specs[i].numel * specs[i].itemsize for i in b.params)
    assert buckets[0].nbytes <= 900 and all(b.nbytes <= 1200 or len(b.params) == 1 for b in buckets)
    ends = [(b.offset, b.offset + b.nbytes) for b in buckets]
    assert all(e0 <= s1 for (_, e0), (s1, _) in itertools.pairwise(ends))
    assert B.total_bytes(buckets) >= ends[-1][1]


def test_bucket_assignment_gives_an_oversized_parameter_its_own_bucket():
    buckets = B.assign_buckets([B.ParamSpec(10, 4, 0), B.ParamSpec(1000, 4, 0)], cap_bytes=100, first_bytes=100)
    assert [b.params for b in buckets] == [(1,), (0,)]


# --- kernels -----------------------------------------------------------------------------------


@settings(max_examples=30)
@given(st.integers(0, 3000), st.integers(1, 5), st.integers(1, 700), st.sampled_from([1.0, 0.25]))
def test_sum_kernels_match_numpy_sum(n, nsrc, block, scale):
    rng = np.random.default_rng(n * 7 + nsrc)
    srcs = [rng.standard_normal(n).astype(np.float32) for _ in range(nsrc)]
    expected = np.zeros(n, dtype=np.float32)
    for s in srcs:
        expected += s
    expected *= np.float32(scale)
    out = np.empty(n, dtype=np.float32)
    kernels.sum_into(srcs, out, scale, block)
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-6)
    slots = [s.copy() for s in srcs]
    kernels.sum_into_all(slots, scale, block)
    for s in slots:
        np.testing.assert_array_equal(s, slots[0])  # bit-identical on every rank
    np.testing.assert_allclose(slots[0], expected, rtol=1e-6, atol=1e-6)
    dst = np.empty(n, dtype=np.float32)
    kernels.scaled_copy(dst, srcs[0], scale, block)
    np.testing.assert_allclose(dst, srcs[0] * np.float32(scale))


# --- shared memory lifetime --------------------------------------------------------------------


def test_segment_create_attach_share_and_unlink():
    seg = shm.Segment.create(8192)
    try:
        assert seg.name in shm.list_segments()
        other = shm.Segment.attach(seg.name)
        a = np.frombuffer(seg.buffer, dtype=np.int64)
        b = np.frombuffer(other.buffer, dtype=np.int64)
        a[5] = 42
        assert b[5] == 42 and other.size == 8192
        seg.unlink()
        assert seg.name not in shm.list_segments()
        b[6] = 7  # the mapping outlives the name
        assert a[6] == 7
        with pytest.raises(FileNotFoundError):
            shm.Segment.attach(seg.name)
        seg.unlink()  # idempotent
        del a, b
        other.close()
        seg.close()
        seg.close()
    finally:
        shm.unlink_name(seg.name)


# The child loads shm.py by path: it needs only the standard library, and skipping the package
# (which imports torch) keeps these tests fast.
_CHILD = """
import importlib.util, os, signal, sys
spec = importlib.util.spec_from_file_location("shm", sys.argv[2])
shm = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shm)
seg = shm.Segment.create(4096)
print(seg.name, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def _child_segment(mode: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, mode, shm.__file__],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.stdout.strip()


def test_segment_name_is_unlinked_at_normal_exit():
    name = _child_segment("exit")
    assert name.startswith(shm.PREFIX)
    assert name not in shm.list_segments()


def test_segment_of_a_killed_creator_is_removed_as_stale():
    name = _child_segment("kill")
    try:
        assert name in shm.list_segments()  # kill -9 inside the setup window leaves the name
        assert name in shm.remove_stale_segments()
        assert name not in shm.list_segments()
    finally:
        shm.unlink_name(name)


def test_stale_cleanup_keeps_segments_of_live_processes():
    seg = shm.Segment.create(4096)
    try:
        assert seg.name not in shm.remove_stale_segments()
        assert seg.name in shm.list_segments()
    finally:
        seg.unlink()


def test_pid_alive_and_start_time():
    assert shm.pid_alive(os.getpid())
    assert shm.process_start_time(os.getpid()) > 0
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not shm.pid_alive(proc.pid)


@pytest.mark.slow  # a fresh interpreter or more: seconds
def test_import_has_no_side_effects():
    code = (
        "import sys; import hfai; assert 'torch' not in sys.modules, 'hfai imported torch'\n"
        "from hfai.reduce import shm; before = set(shm.list_segments())\n"
        "import hfai.reduce, hfai.nn.parallel\n"
        "assert hfai.nn.parallel.DistributedDataParallel is hfai.reduce.DistributedDataParallel\n"
        "assert set(shm.list_segments()) == before, 'import created shared memory'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
