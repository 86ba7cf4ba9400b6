"""The errors haiscale's pipeline raises for bad input; each says what to change."""

from __future__ import annotations


class PipelineError(RuntimeError):
    """Base of haiscale.pipeline's errors."""


class PartitionError(PipelineError, ValueError):
    """``partition``/``make_subgroups`` arguments that do not describe a valid split."""


class MicroBatchError(PipelineError, ValueError):
    """Inputs or labels that cannot be cut into ``chunks`` equal micro-batches."""
