"""ReduceGroup: the ranks of a process group, one shared arena per node, one leader per node.

One collective round over a range of the slots (``_round``) is the whole algorithm::

    every rank      has its input in its own slot            (copied in, or already resident)
    barrier A       inputs ready; descriptors compared       (size mismatch -> every rank raises)
    rank r          sums slice r of the range over all slots (reduce-scatter, in parallel)
      one node:       into slot 0 and copies it to every slot  (resident)  or into the result
      several nodes:  into the result region; barrier; the leader all-reduces the result region
                      with the node leaders (torch.distributed); barrier; each rank copies it
    barrier B       every slot / the result holds the sum

A rank re-enters a range only after barrier A of its next round, which every peer reaches only
after finishing the previous round, so two barriers per round are enough.
"""

from __future__ import annotations

import logging
import platform
import threading
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from hfai.reduce import cuda, kernels, rendezvous, topology
from hfai.reduce import layout as L
from hfai.reduce.control import Control, WaitPolicy
from hfai.reduce.dtypes import DTypeRule, ReduceOp, rule_for
from hfai.reduce.errors import (
    CapacityError,
    GroupAbortedError,
    GroupClosedError,
    InterNodeError,
    NotInitializedError,
    ReduceError,
    SizeMismatchError,
    UnsupportedPlatformError,
    UnsupportedTensorError,
)
from hfai.reduce.shm import Segment

logger = logging.getLogger(__name__)

MiB = 1 << 20


@dataclass(frozen=True)
class ReduceConfig:
    """Tunables of a group. Every rank must pass the same values.

    ``capacity_bytes`` is each rank's slot: larger tensors pass through it in chunks, and
    :meth:`ReduceGroup.shared_buffer` is this big. The node's arena is
    ``(local ranks + 1) * capacity_bytes``. ``timeout_s`` bounds every wait for a peer (and the
    inter-node collective); ``inter_node_backend`` is the torch.distributed backend the node
    leaders use ("gloo" works on host memory directly; "nccl" stages through the GPU).
    """

    timeout_s: float = 300.0
    capacity_bytes: int = 32 * MiB
    block_bytes: int = kernels.DEFAULT_BLOCK_BYTES
    spin_s: float = 0.002
    sleep_s: float = 50e-6
    liveness_interval_s: float = 0.1
    inter_node_backend: str = "gloo"
    check_inter_node_sizes: bool = True

    def wait_policy(self, scale: float = 1.0) -> WaitPolicy:
        return WaitPolicy(
            timeout_s=self.timeout_s * scale,
            spin_s=self.spin_s,
            sleep_s=self.sleep_s,
            liveness_interval_s=self.liveness_interval_s,
        )


@dataclass
class _Views:
    """numpy views of the arena, made once per summing dtype."""

    slots: list[np.ndarray]
    result: np.ndarray


class ReduceGroup:
    """All-reduce among the ranks of a torch.distributed process group. Create with
    :meth:`create` (collective). Not thread-safe across concurrent calls from several threads of
    one rank: calls are serialised by a lock, and every rank must issue the same sequence."""

    def __init__(self, topo, segment, lay, control, config, pg, leaders_pg) -> None:
        self.topo: topology.Topology = topo
        self.config: ReduceConfig = config
        self._seg: Segment = segment
        self._lay: L.ArenaLayout = lay
        self._ctl: Control = control
        self._pg = pg
        self._leaders_pg = leaders_pg
        self._lock = threading.Lock()
        self._seq = 0
        self._views: dict[np.dtype, _Views] = {}
        self._closed = False
        self._aborted: BaseException | None = None
        self._pinned = False

    # --- construction ------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        process_group=None,
        config: ReduceConfig | None = None,
        node_key: str | None = None,
    ) -> ReduceGroup:
        """Collective over ``process_group`` (default: the world group): build the node arenas.

        ``node_key`` overrides how ranks are grouped into nodes (default: hostname + boot id).
        With more than one node every rank of the *default* group must call this, because the
        leaders' group is made with ``torch.distributed.new_group``.
        """
        if not dist.is_available() or not dist.is_initialized():
            raise NotInitializedError(
                "torch.distributed is not initialised; call "
                "torch.distributed.init_process_group(...) first"
            )
        config = config or ReduceConfig()
        pg = process_group or dist.group.WORLD
        topo = topology.discover(pg, node_key)
        _check_store_order(topo.local_size)
        lay = L.ArenaLayout(topo.local_size, L.slot_bytes_for(config.capacity_bytes))
        segment = rendezvous.open_arena(topo, lay, pg)
        header = np.frombuffer(segment.mapping(), dtype=np.int64, count=lay.header_words)
        control = Control(header, lay, topo.local_rank, config.wait_policy())
        try:
            control.publish_identity()
            control.wait_attached()
        finally:
            if topo.is_leader:
                segment.unlink()  # from here on a crash cannot leak the segment
        if not control.enable_liveness_checks():
            logger.warning("peer pids not visible (PID namespaces?); relying on timeouts only")
        leaders_pg = rendezvous.leaders_group(topo, pg, config.timeout_s, config.inter_node_backend)
        return cls(topo, segment, lay, control, config, pg, leaders_pg)

    # --- public API --------------------------------------------------------------------------

    @property
    def capacity_bytes(self) -> int:
        return self._lay.slot_bytes

    def allreduce(self, tensor: torch.Tensor, op: ReduceOp = ReduceOp.SUM) -> torch.Tensor:
        """Reduce ``tensor`` in place across all ranks and return it.

        Any shape, empty included; fp32/fp64 and fp16/bf16 (summed in fp32, then rounded back);
        CPU or CUDA. Every rank must pass the same numel, dtype and op, else every rank raises
        :class:`SizeMismatchError`. The tensor is staged through this rank's slot: it overwrites
        the start of :meth:`shared_buffer`.
        """
        rule = _validate(tensor)
        # no_grad: like torch.distributed, reduce leaf tensors that require grad in place.
        with self._lock, torch.no_grad():
            self._check_usable()
            if tensor.is_cuda:
                self.pin_for_cuda()
            self._seq += 1
            contiguous = tensor.is_contiguous()
            flat = tensor.view(-1) if contiguous else tensor.contiguous().view(-1)
            self._guard(self._allreduce_copy, flat, rule, op)
            if not contiguous:
                tensor.copy_(flat.view(tensor.shape))
        return tensor

    def shared_buffer(self) -> torch.Tensor:
        """This rank's slot as a 1-D uint8 tensor living in shared memory.

        Slice it and ``.view(torch.float32)`` (or float64) to get tensors that
        :meth:`allreduce_shared` reduces with no copy in or out: the way to reach memory speed.
        :meth:`allreduce` stages through the same memory, so do not mix the two on data you keep.
        """
        self._check_usable()
        return self._own_bytes()

    def allreduce_shared(self, view: torch.Tensor, op: ReduceOp = ReduceOp.SUM) -> torch.Tensor:
        """Reduce, in place on every rank, a float32/float64 tensor that lies in
        :meth:`shared_buffer` at the same offset on every rank. Returns ``view``."""
        rule = _validate(view)
        if view.dtype != rule.acc or view.device.type != "cpu" or not view.is_contiguous():
            raise UnsupportedTensorError("allreduce_shared needs a contiguous fp32/fp64 CPU view")
        with self._lock:
            self._check_usable()
            base = view.data_ptr() - self._slot_ptr() if view.numel() else 0
            nbytes = view.numel() * rule.itemsize
            if view.numel() and not (0 <= base and base + nbytes <= self._lay.slot_bytes):
                raise CapacityError("the tensor does not lie inside this group's shared_buffer()")
            if base % rule.itemsize:
                raise CapacityError("the view is not aligned to its dtype inside the buffer")
            self._seq += 1
            start = base // rule.itemsize
            desc = (self._seq, base, view.numel(), rule.code, op.value)
            self._guard(self._round, desc, start, view.numel(), rule, op, True)
        return view

    def pin_for_cuda(self) -> None:
        """Page-lock this rank's slot (no-op without CUDA), so device copies overlap."""
        if not self._pinned:
            self._pinned = cuda.pin(self.shared_buffer())

    def close(self) -> None:
        """Release this rank's references to the arena. Idempotent; not collective."""
        if self._closed:
            return
        self._closed = True
        if self._pinned:
            cuda.unpin(self._own_bytes())
        self._views.clear()
        if self._seg is not None:
            self._seg.close()

    # --- rounds ------------------------------------------------------------------------------

    def _allreduce_copy(self, flat: torch.Tensor, rule: DTypeRule, op: ReduceOp) -> None:
        chunk_elems = self._lay.slot_bytes // rule.itemsize
        views = self._views_for(rule.acc_np)
        mine = torch.from_numpy(views.slots[self.topo.local_rank])
        result = torch.from_numpy(views.result)
        n = flat.numel()
        for s, e in L.chunks(n, chunk_elems):
            m = e - s
            mine[:m].copy_(flat[s:e])
            desc = (self._seq, s, n, rule.code, op.value)
            self._round(desc, 0, m, rule, op, False)
            flat[s:e].copy_(result[:m])

    def _round(self, desc, start: int, m: int, rule: DTypeRule, op: ReduceOp, resident: bool) -> None:
        ctl, topo = self._ctl, self.topo
        ctl.publish_descriptor(desc)
        ctl.barrier("inputs ready")
        _check_descriptors(ctl.descriptors(), topo.node_members)
        views = self._views_for(rule.acc_np)
        lo, hi = L.partition(m, topo.local_size, rule.itemsize)[topo.local_rank]
        lo, hi = start + lo, start + hi
        block = max(1, self.config.block_bytes // rule.itemsize)
        scale = 1.0 / topo.world_size if op is ReduceOp.AVG else 1.0
        mine = [s[lo:hi] for s in views.slots]
        if topo.num_nodes == 1 and resident:
            kernels.sum_into_all(mine, scale, block)
            ctl.barrier("sums written")
            return
        kernels.sum_into(mine, views.result[lo:hi], scale, block)
        ctl.barrier("node sums written")
        if topo.num_nodes > 1:
            if topo.is_leader:
                self._inter_node(views.result[start : start + m], desc)
            # Longer than the leaders' own timeout, so a stuck inter-node collective is reported
            # by the leader (InterNodeError, then abort) rather than as a local timeout.
            ctl.barrier("inter-node all-reduce", timeout_s=2 * self.config.timeout_s)
        if resident:
            own = views.slots[topo.local_rank]
            kernels.scaled_copy(own[start : start + m], views.result[start : start + m], 1.0, block)

    def _inter_node(self, node_sum: np.ndarray, desc) -> None:
        try:
            if self.config.check_inter_node_sizes:
                mine = torch.tensor(desc, dtype=torch.int64)
                seen = [torch.empty_like(mine) for _ in range(self.topo.num_nodes)]
                dist.all_gather(seen, mine, group=self._leaders_pg)
                if any(not torch.equal(other, mine) for other in seen):
                    self._ctl.abort(L.ABORT_SIZE_MISMATCH)
                    lines = "; ".join(
                        f"node {node}: seq={d[0]} offset={d[1]} numel={d[2]} dtype={d[3]} op={d[4]}"
                        for node, d in enumerate(t.tolist() for t in seen)
                    )
                    raise SizeMismatchError(f"nodes disagree on the collective: {lines}")
            if node_sum.size == 0:
                return
            t = torch.from_numpy(node_sum)
            if self.config.inter_node_backend == "nccl":
                dev = t.to(f"cuda:{torch.cuda.current_device()}")
                dist.all_reduce(dev, group=self._leaders_pg)
                t.copy_(dev)
            else:
                dist.all_reduce(t, group=self._leaders_pg)
        except ReduceError:
            raise
        except Exception as e:  # gloo/NCCL report peer failures as RuntimeError and friends
            self._ctl.abort(L.ABORT_INTER_NODE)
            raise InterNodeError(f"inter-node all-reduce between node leaders failed: {e}") from e

    # --- helpers -----------------------------------------------------------------------------

    def _guard(self, fn, *args) -> None:
        """Run a collective; on any failure abort the arena so peers raise instead of waiting."""
        try:
            fn(*args)
        except BaseException as e:
            code = L.ABORT_SIZE_MISMATCH if isinstance(e, SizeMismatchError) else L.ABORT_ERROR
            self._ctl.abort(code)
            self._aborted = e
            raise

    def _check_usable(self) -> None:
        if self._closed:
            raise GroupClosedError("this reduce group was closed")
        if self._aborted is not None:
            raise GroupAbortedError(
                f"this reduce group was aborted earlier: {self._aborted}"
            ) from self._aborted
        self._ctl.check_abort()

    def _views_for(self, dt: np.dtype) -> _Views:
        views = self._views.get(dt)
        if views is None:
            buf, lay = self._seg.mapping(), self._lay
            count = lay.slot_bytes // dt.itemsize
            views = _Views(
                slots=[
                    np.frombuffer(buf, dtype=dt, count=count, offset=lay.slot_offset(r))
                    for r in range(lay.nranks)
                ],
                result=np.frombuffer(buf, dtype=dt, count=count, offset=lay.result_offset),
            )
            self._views[dt] = views
        return views

    def _slot_ptr(self) -> int:
        return self._views_for(np.dtype(np.uint8)).slots[self.topo.local_rank].ctypes.data

    def _own_bytes(self) -> torch.Tensor:
        return torch.from_numpy(self._views_for(np.dtype(np.uint8)).slots[self.topo.local_rank])


#: CPUs with total store order: the barrier's generation store is seen after the data stores
#: before it with no fence (see control.py). Weakly ordered CPUs (aarch64, ppc64le) would need one.
_TSO_MACHINES = frozenset({"x86_64", "amd64", "i386", "i686"})


def _check_store_order(local_size: int) -> None:
    """Refuse, on every rank of the node alike, to share an arena where sums could be read stale."""
    machine = platform.machine()
    if local_size > 1 and machine.lower() not in _TSO_MACHINES:
        raise UnsupportedPlatformError(
            f"hfai.reduce shares memory between the {local_size} ranks of a node only on x86-64 "
            f"(its barrier relies on x86-64 store order); this CPU is {machine!r}: "
            "use torch.distributed / torch DDP here"
        )


def _validate(tensor) -> DTypeRule:
    if not isinstance(tensor, torch.Tensor):
        raise UnsupportedTensorError(f"expected a torch.Tensor, got {type(tensor).__name__}")
    if tensor.layout != torch.strided:
        raise UnsupportedTensorError(f"only dense tensors can be reduced, got {tensor.layout}")
    return rule_for(tensor.dtype)


def _check_descriptors(descs: list[tuple[int, ...]], members: tuple[int, ...]) -> None:
    if all(d == descs[0] for d in descs):
        return
    lines = "; ".join(
        f"rank {members[r]}: seq={d[0]} offset={d[1]} numel={d[2]} dtype={d[3]} op={d[4]}"
        for r, d in enumerate(descs)
    )
    raise SizeMismatchError(f"ranks disagree on the collective: {lines}")
