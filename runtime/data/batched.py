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
        if isinstance(samples, (list, tuple)) and len(samples) == len(indices):
            return list(samples)
        # Not one sample per index (yolov5 returns (imgs, labels, shapes)): only a collate_fn
        # the user gave knows what it is, as in the original loader, which hands the return
        # value to collate_fn unchanged. BatchCollate unwraps it for such a function.
        count = len(samples) if hasattr(samples, "__len__") else "no list of"
        return UncountedBatch(  # type: ignore[return-value]
            samples,
            f"{type(self).__name__}.__getitem__ returned {count} samples for {len(indices)} indices; "
            "the default collate needs one sample per index, in order (or load it with "
            "ffrecord.torch.DataLoader or hfai.data.DataLoader and a collate_fn that takes what "
            "__getitem__ returns)",
        )


class UncountedBatch:
    """A batched dataset's ``__getitem__(indices)`` result that is not one sample per index
    (``value``); :class:`BatchCollate` hands it to a user's ``collate_fn`` and refuses it for the
    default collate with ``message``."""

    __slots__ = ("message", "value")

    def __init__(self, value: Any, message: str):
        self.value = value
        self.message = message

    def __repr__(self) -> str:
        return f"UncountedBatch({self.message})"

    # Reached only where no BatchCollate unwraps it (a stock torch DataLoader): whatever its
    # collate function does first, it learns what went wrong.
    def __getitem__(self, index: Any) -> Any:
        raise ValueError(self.message)

    def __iter__(self) -> Any:
        raise ValueError(self.message)

    def __len__(self) -> int:
        raise ValueError(self.message)


class BatchCollate:
    """The loaders' collate function over batched datasets: ``fn(batch)``, where a user's
    ``fn`` (``user_given``) receives an :class:`UncountedBatch`'s value as it is and the
    default one refuses it (``ValueError``). Picklable, for spawned workers."""

    def __init__(self, fn: Any, user_given: bool):
        self.fn = fn
        self.user_given = user_given

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, UncountedBatch):
            if not self.user_given:
                raise ValueError(batch.message)
            batch = batch.value
        return self.fn(batch)


def is_batched(dataset: object) -> bool:
    """Does ``dataset`` take a list of indices per call (a :class:`BatchedDataset`)?"""
    return isinstance(dataset, BatchedDataset)
