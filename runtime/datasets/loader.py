"""``dataset.loader(...)``: torch's DataLoader over a batched dataset, resumable with ``set_step``.

Everything torch's DataLoader takes is accepted and means the same (``sampler=`` a
``DistributedSampler`` is followed, including the ``set_epoch`` the caller makes on it). One
addition: ``set_step(k)`` makes the next iteration start at batch ``k``; the first ``k`` batches
are drawn from the sampler as indices only, never read, so a job resumed at step ``k`` of an
epoch gets exactly the batches the interrupted run had left.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.utils.data


class SkippingBatchSampler(torch.utils.data.Sampler):
    """Wraps a batch sampler; ``set_step(k)`` drops the first ``k`` batches of the next iteration."""

    def __init__(self, batch_sampler: Any):
        self.batch_sampler = batch_sampler
        self._skip = 0

    def set_step(self, step: int) -> None:
        total = len(self.batch_sampler)
        if not 0 <= step <= total:
            raise ValueError(f"set_step: step must be in [0, {total}] (batches per epoch), got {step}")
        self._skip = step

    def __iter__(self) -> Iterator[list[int]]:
        # The pending skip is taken when the first batch is drawn, not in iter(): torch's
        # multi-process iterator calls iter() twice and draws only from the second one.
        skip, self._skip = self._skip, 0
        for i, batch in enumerate(self.batch_sampler):
            if i >= skip:
                yield batch

    def __len__(self) -> int:
        return len(self.batch_sampler) - self._skip


class Loader(torch.utils.data.DataLoader):
    """torch's ``DataLoader(dataset, batch_size, ...)`` plus :meth:`set_step`.

    A one-shot skip, like ``hfai.data.DataLoader``: it applies to the next iteration only, so
    ``loader.set_step(start_step)`` at the top of every epoch (what the hfai scripts do) is right
    and a later epoch never skips by accident. ``len(loader)`` counts the batches the next
    iteration will yield.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, *args: Any, **kwargs: Any):
        if kwargs.get("batch_sampler") is not None:
            raise ValueError("loader(): give batch_size (and sampler=), not batch_sampler")
        super().__init__(dataset, batch_size, *args, **kwargs)
        skipping = SkippingBatchSampler(self.batch_sampler)
        # torch forbids setting batch_sampler after __init__; the wrapper yields the same batches.
        object.__setattr__(self, "batch_sampler", skipping)
        self._skipping = skipping

    def set_step(self, step: int) -> None:
        """Resume: the next iteration skips its first ``step`` batches without reading them."""
        self._skipping.set_step(step)
