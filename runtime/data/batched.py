"""Batched datasets: ``__getitem__`` takes a list of indices and returns a list of samples.

This is the dataset style of HFAiLab's ffrecord (``ffrecord.torch.Dataset``) and of
``hfai.datasets``: a dataset reads a whole batch in one call, so the reads of a batch run in
parallel. Subclass :class:`BatchedDataset`, define ``__len__`` and ``__getitem__(self, indices)``,
and load it with :class:`hfai.data.DataLoader` (or ``ffrecord.torch.DataLoader``; the stock
``torch.utils.data.DataLoader`` works too): the loader hands each batch of indices from its
(batch) sampler to the subclass's ``__getitem__`` in one call, and collates the returned list.

Importing this module imports torch; ``hfai.data.BatchedDataset`` loads it lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.utils.data


class BatchedDataset(torch.utils.data.Dataset):
    """Base class of batched datasets (see the module docstring).

    A subclass needs no ``super().__init__()`` call: the base class keeps no state. Whatever
    else it overrides, the loader always calls the subclass's own ``__getitem__`` with a list of
    ``int`` (never a single index), and ``dataset[[i]]`` is the one-sample batch.

    Example::

        class Squares(BatchedDataset):
            def __len__(self):
                return 100

            def __getitem__(self, indices):
                return [i * i for i in indices]

        loader = hfai.data.DataLoader(Squares(), 10, sampler=DistributedSampler(...))
    """

    def __getitem__(self, indices: list[int]) -> list[Any]:
        raise NotImplementedError(f"{type(self).__name__} must define __getitem__(self, indices) returning a list")

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        # torch's map-style fetcher calls __getitems__ with a batch when a dataset has it: route
        # it to the subclass's __getitem__ (looked up on the type, so any override wins).
        samples = type(self).__getitem__(self, [int(i) for i in indices])
        if len(samples) != len(indices):
            raise ValueError(
                f"{type(self).__name__}.__getitem__ returned {len(samples)} samples for {len(indices)} indices; "
                "a batched dataset returns one sample per index, in order"
            )
        return list(samples)


def is_batched(dataset: object) -> bool:
    """Does ``dataset`` take a list of indices per call (a :class:`BatchedDataset`)?"""
    return isinstance(dataset, BatchedDataset)
