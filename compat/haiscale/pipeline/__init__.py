"""``haiscale.pipeline``: pipeline parallelism as hfai scripts use it, on torch's schedules.

``partition`` cuts a :class:`SequentialModel` (or any ``nn.Sequential``) into this rank's
stage, ``make_subgroups`` splits the world into data- and pipeline-parallel groups, and
:class:`GPipe`, :class:`PipeDream` (1F1B) and :class:`Interleaved1F1B` run
``forward_backward`` over micro-batches with ``torch.distributed.pipelining``. See
docs/haiscale.md.
"""

from haiscale.pipeline.errors import MicroBatchError, PartitionError, PipelineError
from haiscale.pipeline.groups import make_subgroups
from haiscale.pipeline.schedule import GPipe, Interleaved1F1B, PipeDream
from haiscale.pipeline.sequential import SequentialModel, partition

__all__ = [
    "GPipe",
    "Interleaved1F1B",
    "MicroBatchError",
    "PartitionError",
    "PipeDream",
    "PipelineError",
    "SequentialModel",
    "make_subgroups",
    "partition",
]
