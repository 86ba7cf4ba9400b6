"""GPipe, PipeDream (1F1B) and Interleaved1F1B: haiscale's pipeline wrappers on torch's schedules.

Every rank of the pipeline group calls the same method with the same arguments (SPMD). Only the
first stage's inputs and the last stage's labels are used; the first stage tells the others the
micro-batch signature each step (one small broadcast), and a new signature (first call, another
batch size, training vs. evaluation) builds a new set of stages from a probe (see ``_probe``).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from haiscale.pipeline import _probe
from haiscale.pipeline.errors import MicroBatchError, PipelineError
from haiscale.pipeline.stage import CHECKPOINT_MODES, CheckpointedStage, HaiStage, find_hfreduce_ddp

logger = logging.getLogger(__name__)

# Built stage sets kept per signature (training and evaluation, a different last batch):
# each holds receive buffers for every micro-batch, so the number kept is bounded.
_CACHE_SIZE = 4


def _module_device(module: nn.Module) -> torch.device:
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return torch.device("cpu")


def split_microbatches(tensors: Sequence[torch.Tensor], chunks: int, what: str) -> list[tuple[torch.Tensor, ...]]:
    """Cut every tensor along dim 0 into ``chunks`` equal parts; micro-batch i gets part i of each."""
    for t in tensors:
        if t.dim() == 0 or t.shape[0] == 0 or t.shape[0] % chunks != 0:
            size = "a 0-d tensor" if t.dim() == 0 else f"dim 0 of size {t.shape[0]}"
            raise MicroBatchError(
                f"{what}: {size} cannot be cut into chunks={chunks} equal micro-batches; "
                "make the batch size a multiple of chunks"
            )
    parts = [t.chunk(chunks) for t in tensors]
    return [tuple(p[i] for p in parts) for i in range(chunks)]


class _Built:
    """One signature's stages and torch schedule."""

    def __init__(self, stages: list[HaiStage], schedule) -> None:
        self.stages = stages
        self.schedule = schedule


class _Pipeline(nn.Module):
    """What the three schedules share. ``module`` is this rank's stage (``Interleaved1F1B``: its
    list of stages); ``chunks`` the number of micro-batches per call."""

    def __init__(self, modules: list[nn.Module], chunks: int, process_group=None, checkpoint: str = "never") -> None:
        super().__init__()
        if not dist.is_initialized():
            raise PipelineError("pipeline parallelism needs torch.distributed; call init_process_group(...) first")
        if int(chunks) < 1:
            raise MicroBatchError(f"chunks must be >= 1, got {chunks}")
        if checkpoint not in CHECKPOINT_MODES:
            raise PipelineError(f"checkpoint={checkpoint!r}: use one of {', '.join(CHECKPOINT_MODES)}")
        self.chunks = int(chunks)
        self.checkpoint = checkpoint
        self.group = process_group if process_group is not None else dist.group.WORLD
        self.pp_rank = dist.get_rank(self.group)
        self.pp_size = dist.get_world_size(self.group)
        self._ranks = dist.get_process_group_ranks(self.group)
        self._stage_modules = modules
        self.num_stages = self.pp_size * len(modules)
        self._stage_indices = [self.pp_rank + i * self.pp_size for i in range(len(modules))]
        self._wrapped = [m if checkpoint == "never" else CheckpointedStage(m, checkpoint, self.chunks) for m in modules]
        self._built: OrderedDict[tuple, _Built] = OrderedDict()
        self._criterion = None
        self._labels: list[tuple[torch.Tensor, ...]] = []

    # --- who is who --------------------------------------------------------------------------

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        """True on the rank that holds the last stage (where losses and outputs appear)."""
        return self.pp_rank == self.pp_size - 1

    def _rank_of(self, stage_index: int) -> int:
        return self._ranks[stage_index % self.pp_size]

    # --- public API ---------------------------------------------------------------------------

    def forward_backward(self, *inputs, criterion=None, labels=(), return_outputs: bool = False):
        """Run forward and backward over ``chunks`` micro-batches; gradients accumulate in the
        stage's parameters (call ``optimizer.step()`` afterwards).

        Micro-batch i is part i of every input and every label, cut along dim 0. The gradient is
        that of the *sum* of ``criterion(output_i, *labels_i)`` over micro-batches, so a criterion
        that should average divides by ``chunks`` itself. Returns ``(loss, outputs)``: on the
        last stage ``loss`` is a detached tensor of the ``chunks`` micro-batch losses and
        ``outputs`` the last stage's outputs (concatenated) if ``return_outputs``, else None; on
        other stages both are None.
        """
        if criterion is None:
            raise PipelineError("forward_backward needs criterion=...: the loss computed on the last stage")
        if not torch.is_grad_enabled():
            raise PipelineError("forward_backward cannot run under torch.no_grad(); call the model instead")
        label_list = tuple(labels) if isinstance(labels, (tuple, list)) else (labels,)
        # Checked wherever given (every rank, in SPMD use), so a bad label fails on all ranks
        # before any of them enters the schedule.
        label_mbs = split_microbatches(_probe.as_tensor_tuple(label_list, "labels"), self.chunks, "labels")
        built, args = self._prepare(inputs, has_backward=True)
        self._criterion = criterion
        self._labels = label_mbs if label_list else []
        losses: list[torch.Tensor] = []
        try:
            out = built.schedule.step(
                *args, target=torch.arange(self.chunks), losses=losses, return_outputs=return_outputs
            )
        finally:
            self._criterion, self._labels = None, []
        if not self.is_last_stage:
            return None, None
        return torch.stack([loss.detach() for loss in losses]), (out if return_outputs else None)

    def forward(self, *inputs):
        """Forward only (evaluation): the last stage's outputs on the last stage, None elsewhere.
        Outputs are not connected to earlier stages' autograd graphs; train with
        :meth:`forward_backward`."""
        built, args = self._prepare(inputs, has_backward=False)
        return built.schedule.step(*args)

    # --- building -----------------------------------------------------------------------------

    def _prepare(self, inputs: tuple, has_backward: bool):
        for m in self._wrapped:
            if isinstance(m, CheckpointedStage):
                m.new_step()
        mbs: list[tuple[torch.Tensor, ...]] = []
        tensors: tuple[torch.Tensor, ...] = ()
        sig: object = None
        if self.is_first_stage:
            try:
                tensors = _probe.as_tensor_tuple(inputs, "pipeline inputs")
                mbs = split_microbatches(tensors, self.chunks, "inputs")
                sig = tuple(_probe.TensorSig.of(t) for t in mbs[0])
            except PipelineError as e:
                sig = e  # every stage raises it, rather than the others waiting for a step
        box = [sig]
        dist.broadcast_object_list(box, src=self._ranks[0], group=self.group, device=self._device)
        if isinstance(box[0], PipelineError):
            raise box[0]
        key = (has_backward, box[0])
        built = self._built.get(key)
        if built is None:
            built = self._build(mbs[0] if mbs else None, has_backward)
            self._built[key] = built
            if len(self._built) > _CACHE_SIZE:
                # Every rank sees the same keys in the same order, so all evict the same entry.
                self._built.popitem(last=False)
        else:
            self._built.move_to_end(key)
        # Only the first stage feeds inputs; torch cuts them as split_microbatches did.
        return built, tensors

    @property
    def _device(self) -> torch.device:
        return _module_device(self._stage_modules[0])

    def _build(self, first_mb: tuple[torch.Tensor, ...] | None, has_backward: bool) -> _Built:
        logger.debug("stage %s: building stages for a new micro-batch signature", self._stage_indices)
        stages = []
        for module, wrapped, index in zip(self._stage_modules, self._wrapped, self._stage_indices, strict=True):
            device = _module_device(module)
            if index == 0:
                assert first_mb is not None  # the first stage lives on pp rank 0, which split the inputs
                example_in = tuple(t.detach().requires_grad_(t.requires_grad) for t in first_mb)
            else:
                example_in = _probe.recv_activation(self._rank_of(index - 1), self.group, device, has_backward)
            example_out = _probe.run_stage(module, example_in, device, grad=has_backward)
            if index != self.num_stages - 1:
                _probe.send_activation(example_out, self._rank_of(index + 1), self.group, device)
            stages.append(
                HaiStage(
                    wrapped,
                    index,
                    self.num_stages,
                    device,
                    input_args=example_in,
                    output_args=example_out,
                    group=self.group,
                    ddp=find_hfreduce_ddp(module),
                )
            )
        loss_fn = self._loss if has_backward else None
        return _Built(stages, self._make_schedule(stages, loss_fn))

    def _make_schedule(self, stages: list[HaiStage], loss_fn):
        raise NotImplementedError

    def _loss(self, output, index: torch.Tensor) -> torch.Tensor:
        # torch hands the loss function one "target" per micro-batch; ours is the micro-batch's
        # number, which picks its labels (any number of them, which torch's target cannot carry).
        assert self._criterion is not None
        labels = self._labels[int(index.reshape(-1)[0])] if self._labels else ()
        return self._criterion(output, *labels)


class GPipe(_Pipeline):
    """GPipe schedule (all forwards, then all backwards) over this rank's stage ``module``.

    ``checkpoint``: ``"never"`` (default), ``"except_last"`` (recompute every micro-batch but the
    last in backward) or ``"always"``. ``process_group``: the pipeline's ranks, stage i on its
    rank i (default: the world).
    """

    def __init__(self, module: nn.Module, chunks: int, process_group=None, checkpoint: str = "never") -> None:
        super().__init__([module], chunks, process_group, checkpoint)
        self.module = module

    def _make_schedule(self, stages, loss_fn):
        return ScheduleGPipe(stages[0], self.chunks, loss_fn=loss_fn, scale_grads=False)


class PipeDream(_Pipeline):
    """1F1B schedule (PipeDream-flush: one forward, one backward in the steady state, at most
    ``pp_size`` micro-batches of activations alive) over this rank's stage ``module``."""

    def __init__(self, module: nn.Module, chunks: int, process_group=None, checkpoint: str = "never") -> None:
        super().__init__([module], chunks, process_group, checkpoint)
        self.module = module

    def _make_schedule(self, stages, loss_fn):
        return Schedule1F1B(stages[0], self.chunks, loss_fn=loss_fn, scale_grads=False)


class Interleaved1F1B(_Pipeline):
    """Interleaved 1F1B (Megatron's virtual stages): ``modules`` are this rank's model chunks,
    stages ``rank, rank + pp_size, ...`` as :func:`partition` with ``num_model_chunks`` returns
    them. ``module`` is them as an ``nn.ModuleList``."""

    def __init__(
        self, modules: Sequence[nn.Module], chunks: int, process_group=None, checkpoint: str = "never"
    ) -> None:
        modules = list(modules) if not isinstance(modules, nn.Module) else [modules]
        if not modules:
            raise PipelineError("Interleaved1F1B needs this rank's list of model chunks")
        super().__init__(modules, chunks, process_group, checkpoint)
        self.module = nn.ModuleList(modules)

    def _make_schedule(self, stages, loss_fn):
        try:
            return ScheduleInterleaved1F1B(stages, self.chunks, loss_fn=loss_fn, scale_grads=False)
        except ValueError as e:
            raise MicroBatchError(f"Interleaved1F1B with chunks={self.chunks}, pp_size={self.pp_size}: {e}") from e
