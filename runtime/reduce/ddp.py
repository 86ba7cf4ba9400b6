"""DistributedDataParallel over hfai.reduce: torch's DDP interface, gradients in shared memory.

Differences from ``torch.nn.parallel.DistributedDataParallel`` a caller should know:

* Gradients of fp32/fp64 CPU parameters *are* views into the shared arena after the first
  backward (as with torch's ``gradient_as_bucket_view=True``), whatever that flag says: backward
  accumulates straight into shared memory and the reduction needs no copy in or out. Zeroing with
  ``zero_grad(set_to_none=False)`` keeps them there; ``set_to_none=True`` costs one copy per step.
* Parameters without a gradient in a step contribute zeros. With ``find_unused_parameters=True``
  a parameter that no rank used keeps ``grad=None`` (if it was None); without it, such a parameter
  gets a zero gradient instead of torch's error.
* ``auto_sync=False`` (manual mode) reduces nothing during backward; call :meth:`sync_grad`.
* ``device_ids``, ``output_device``, ``dim``, ``check_reduction`` and ``static_graph`` are
  accepted for compatibility and have no effect (the module runs on the device it is on).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import weakref
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hfai.reduce import buckets as B
from hfai.reduce.dtypes import ReduceOp, rule_for
from hfai.reduce.errors import NotInitializedError, ReduceError
from hfai.reduce.group import MiB, ReduceConfig, ReduceGroup
from hfai.reduce.reducer import BucketReducer

logger = logging.getLogger(__name__)


class DistributedDataParallel(nn.Module):
    """Data-parallel wrapper whose gradient all-reduce (average) runs through hfai.reduce.

    Construction is collective over ``process_group`` (default: world): it broadcasts the module's
    parameters and buffers from rank 0 and builds a shared arena sized for all gradients.
    ``reduce_config`` tunes timeouts (its ``capacity_bytes`` is replaced by the gradient size);
    ``node_key`` overrides node detection (tests simulate nodes with it).
    """

    def __init__(
        self,
        module: nn.Module,
        device_ids=None,
        output_device=None,
        dim: int = 0,
        broadcast_buffers: bool = True,
        process_group=None,
        bucket_cap_mb: float | None = 25,
        find_unused_parameters: bool = False,
        check_reduction: bool = False,
        gradient_as_bucket_view: bool = False,
        static_graph: bool = False,
        *,
        init_sync: bool = True,
        auto_sync: bool = True,
        reduce_config: ReduceConfig | None = None,
        node_key: str | None = None,
    ) -> None:
        super().__init__()
        if not (dist.is_available() and dist.is_initialized()):
            raise NotInitializedError("call torch.distributed.init_process_group(...) first")
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self.find_unused_parameters = find_unused_parameters
        self.auto_sync = auto_sync
        self.process_group = process_group or dist.group.WORLD
        # dist.group.WORLD is None only before init_process_group, ruled out above.
        assert self.process_group is not None
        self._src = dist.get_global_rank(self.process_group, 0)
        self._params = _unique_params(module)
        if init_sync:
            self._broadcast(list(self._params) + list(module.buffers()))
        self._sync_enabled = True
        self._require_forward_param_sync = True
        self._step_active = False
        self._build(bucket_cap_mb, reduce_config, node_key)

    # --- construction ------------------------------------------------------------------------

    def _build(self, bucket_cap_mb, reduce_config, node_key) -> None:
        cap = int((bucket_cap_mb if bucket_cap_mb is not None else 25) * MiB)
        self._buckets = B.assign_buckets([_spec(p) for p in self._params], cap)
        # After the buckets, one fp32 per parameter for the used-parameter counts.
        self._used_offset = B.total_bytes(self._buckets)
        capacity = self._used_offset + 4 * len(self._params)
        config = dataclasses.replace(reduce_config or ReduceConfig(), capacity_bytes=capacity)
        self._group = ReduceGroup.create(self.process_group, config, node_key)
        on_cuda = any(p.is_cuda for p in self._params)
        if on_cuda:
            self._group.pin_for_cuda()
        self._copy_stream = torch.cuda.Stream() if on_cuda else None
        bucket_views = self._map_views(self._group.shared_buffer())
        group = self._group
        self._reducer = BucketReducer(
            [functools.partial(group.allreduce_shared, v, ReduceOp.AVG) for v in bucket_views]
        )
        self._ready = [False] * len(self._params)
        self._pending = [0] * len(self._buckets)
        self._hooks = [
            p.register_post_accumulate_grad_hook(_weak_hook(self, i))
            for i, p in enumerate(self._params)
        ]
        self._finalizer = weakref.finalize(self, _close, self._reducer, self._group, self._hooks)

    def _map_views(self, slot: torch.Tensor) -> list[torch.Tensor]:
        """Give every parameter (and the used counts) its place in the slot; return the
        buckets' views."""
        n = len(self._params)
        self._used = slot[self._used_offset : self._used_offset + 4 * n].view(torch.float32)
        self._views: list[torch.Tensor] = [None] * n  # type: ignore[list-item]
        self._bucket_of = [0] * n
        bucket_views = []
        for b in self._buckets:
            acc = torch.float64 if b.itemsize == 8 else torch.float32
            bucket_views.append(slot[b.offset : b.offset + b.nbytes].view(acc))
            for i, off in zip(b.params, b.param_offsets, strict=True):
                p = self._params[i]
                self._views[i] = slot[off : off + p.numel() * b.itemsize].view(acc).view(p.shape)
                self._bucket_of[i] = b.index
        # These gradients can live in the arena itself: same dtype, on the host, same layout.
        self._resident = [
            p.dtype == v.dtype and p.device.type == "cpu" and p.is_contiguous()
            for p, v in zip(self._params, self._views, strict=True)
        ]
        return bucket_views

    # --- public API --------------------------------------------------------------------------

    def forward(self, *inputs, **kwargs):
        # As torch's DDP: buffers are broadcast from rank 0 before a forward unless the previous
        # forward ran without gradient sync (inside no_sync() or with grad disabled).
        if self._require_forward_param_sync and self.broadcast_buffers:
            buffers = list(self.module.buffers())
            if buffers:
                self._broadcast(buffers)
        output = self.module(*inputs, **kwargs)
        self._require_forward_param_sync = torch.is_grad_enabled() and self._sync_enabled
        return output

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Inside, backward only accumulates gradients locally; the next synced backward (or
        :meth:`sync_grad`) reduces the accumulated sum."""
        old, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = old

    def sync_grad(self) -> None:
        """Average all gradients across ranks now (manual mode, or after ``no_sync``).
        Collective: every rank must call it."""
        if self._step_active:
            raise ReduceError("sync_grad() called during a backward pass")
        self._begin_step()
        for i, p in enumerate(self._params):
            if p.grad is not None:
                self._stage(i)
                self._mark_ready(i)
        self._complete_step()

    def close(self) -> None:
        """Stop the communication thread, remove hooks, release the arena. Idempotent."""
        self._finalizer()

    # --- the step ----------------------------------------------------------------------------

    def _on_grad(self, i: int) -> None:
        if not (self.auto_sync and self._sync_enabled):
            return
        if not self._step_active:
            self._begin_step()
            torch.autograd.Variable._execution_engine.queue_callback(self._complete_step)
        if self._ready[i]:
            raise ReduceError(
                f"parameter {i} received its gradient twice in one backward pass (reentrant "
                "checkpointing or a shared parameter reached twice); use no_sync() + sync_grad()"
            )
        self._stage(i)
        self._mark_ready(i)

    def _begin_step(self) -> None:
        self._reducer.start_step()
        self._step_active = True
        self._ready = [False] * len(self._params)
        self._pending = [len(b.params) for b in self._buckets]

    def _stage(self, i: int) -> None:
        """Put parameter i's gradient into its place in the shared slot."""
        p, view, g = self._params[i], self._views[i], self._params[i].grad
        if g is None:
            view.zero_()
        elif self._resident[i]:
            if g.data_ptr() != view.data_ptr():
                view.copy_(g)
                p.grad = view
        elif g.is_cuda:
            # A CUDA gradient belongs to a CUDA parameter, for which _build made the copy stream.
            assert self._copy_stream is not None
            self._copy_stream.wait_stream(torch.cuda.current_stream(g.device))
            with torch.cuda.stream(self._copy_stream):
                view.copy_(g, non_blocking=True)
        else:
            view.copy_(g)

    def _mark_ready(self, i: int) -> None:
        self._ready[i] = True
        b = self._bucket_of[i]
        self._pending[b] -= 1
        if self._pending[b] == 0:
            before = None
            if self._copy_stream is not None:
                event = torch.cuda.Event()
                event.record(self._copy_stream)
                before = event.synchronize
            self._reducer.submit(b, before)

    def _complete_step(self) -> None:
        """End of backward: fill in unused parameters, wait for the reductions, copy back."""
        try:
            unused = [i for i, r in enumerate(self._ready) if not r]
            had_grad = {i: self._params[i].grad is not None for i in unused}
            for i in unused:
                self._views[i].zero_()
                self._mark_ready(i)
            self._reducer.wait_all(3 * self._group.config.timeout_s)
            globally_used = self._globally_used(unused)
            for i in range(len(self._params)):
                if i in had_grad and not had_grad[i] and not globally_used.get(i, True):
                    continue
                self._unstage(i)
            if self._copy_stream is not None:
                # The host-to-device copies read the arena, which peers overwrite next step.
                torch.cuda.current_stream().synchronize()
        finally:
            self._step_active = False

    def _globally_used(self, unused: list[int]) -> dict[int, bool]:
        if not self.find_unused_parameters:
            return {}
        # In the arena, not through allreduce(): that stages through the slot's first bytes,
        # where the gradient buckets live.
        used = self._used
        used.fill_(1.0)
        used[unused] = 0.0
        self._group.allreduce_shared(used)
        return {i: bool(used[i] > 0) for i in range(len(self._params))}

    def _unstage(self, i: int) -> None:
        p, view = self._params[i], self._views[i]
        if self._resident[i]:
            p.grad = view
        elif p.grad is None:
            p.grad = view.to(device=p.device, dtype=p.dtype, non_blocking=True)
        else:
            p.grad.copy_(view, non_blocking=p.grad.is_cuda)

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        by_type: dict[tuple, list[torch.Tensor]] = {}
        for t in tensors:
            by_type.setdefault((t.device, t.dtype), []).append(t)
        with torch.no_grad():
            for group in by_type.values():
                flat = _flatten_dense_tensors([t.detach() for t in group])
                dist.broadcast(flat, src=self._src, group=self.process_group)
                for t, synced in zip(group, _unflatten_dense_tensors(flat, group), strict=True):
                    t.copy_(synced)


def _spec(p: torch.Tensor) -> B.ParamSpec:
    rule = rule_for(p.dtype)
    # fp16, bf16 and fp32 all sum in fp32 and may share a bucket; fp64 gets its own.
    return B.ParamSpec(p.numel(), rule.itemsize, rule.code if rule.acc == torch.float64 else 0)


def _unique_params(module: nn.Module) -> list[nn.Parameter]:
    seen: set[int] = set()
    out = []
    for p in module.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _weak_hook(ddp: DistributedDataParallel, i: int):
    # A weak reference: the hooks live on the parameters, which must not keep the wrapper alive.
    ref = weakref.ref(ddp)

    def hook(_param: torch.Tensor) -> None:
        obj = ref()
        if obj is not None:
            obj._on_grad(i)

    return hook


def _close(reducer: BucketReducer, group: ReduceGroup, hooks) -> None:
    for h in hooks:
        h.remove()
    reducer.close()
    group.close()
