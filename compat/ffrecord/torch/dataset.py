"""``ffrecord.torch.Dataset`` and its relatives, as HFAiLab's ffrecord defines them.

Datasets here are **batched** (:class:`hfai.data.BatchedDataset`): ``dataset[indices]`` takes a
list of indices and returns a list of samples. Users subclass :class:`Dataset` with their own
``__init__`` (calling ``super().__init__(fnames)`` or not) and either their own
``__getitem__(self, indices)`` or a ``process(indices, data)`` hook over the raw bytes.
"""

from __future__ import annotations

import bisect
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from hfai.data.batched import BatchedDataset
from hfai.data.reader import FileReader


class ReaderRegistry:
    """Finds the :class:`~ffrecord.FileReader` objects an object holds: :meth:`ffreaders`.

    The readers are the object's attributes that are readers, then, recursively, those of its
    attributes that are registries themselves, in the order the attributes were set (as in the
    original). Attributes stay ordinary attributes.
    """

    def ffreaders(self) -> list[FileReader]:
        """Every reader held directly by this object or by a registry it holds."""
        fields = getattr(self, "__dict__", {}).values()
        readers = [v for v in fields if isinstance(v, FileReader)]
        for value in fields:
            if isinstance(value, ReaderRegistry):
                readers.extend(value.ffreaders())
        return readers


class Dataset(BatchedDataset, ReaderRegistry):
    """An ffrecord dataset that reads a batch of samples per call.

    ``Dataset(fnames, check_data=True)`` opens ``self.reader`` (a :class:`~ffrecord.FileReader`
    over a file, a directory of ``*.ffr`` or a list) and sets ``self.fnames``. The default
    ``__getitem__(indices)`` reads the raw samples (uint8 numpy arrays) and returns
    ``self.process(indices, data)``, which subclasses define; or a subclass defines its own
    ``__getitem__(indices)`` and ``__len__``, with or without calling ``super().__init__()``.
    The loaders (:class:`ffrecord.torch.DataLoader`, :class:`hfai.data.DataLoader`) always call
    the subclass's ``__getitem__`` with a list of ints. ``a + b`` is a :class:`ConcatDataset`.
    """

    def __init__(self, fnames: str | os.PathLike | Sequence[str | os.PathLike], check_data: bool = True):
        self.fnames = fnames
        self.reader = FileReader(fnames, check_data)

    def __len__(self) -> int:
        reader = getattr(self, "reader", None)
        if reader is None:
            raise TypeError(f"{type(self).__name__} has no reader: define __len__ (or call super().__init__(fnames))")
        return reader.n

    def __getitem__(self, indices: list[int]) -> list[Any]:
        if not isinstance(indices, (list, tuple, np.ndarray)):
            raise TypeError(
                f"{type(self).__name__}[...] takes a list of indices (a batch), not {type(indices).__name__}; "
                "use dataset[[i]] for one sample"
            )
        reader = getattr(self, "reader", None)
        if reader is None:
            raise TypeError(
                f"{type(self).__name__} has no reader: define __getitem__(self, indices) "
                "(or call super().__init__(fnames))"
            )
        return self.process(indices, reader.read(indices))

    def process(self, indices: Sequence[int], data: list[np.ndarray]) -> list[Any]:
        """Turn the raw bytes of one batch (uint8 arrays) into the samples handed to collate_fn."""
        raise NotImplementedError(f"{type(self).__name__} must define process(indices, data) or __getitem__")

    def __add__(self, other: Dataset) -> ConcatDataset:  # type: ignore[override]
        return ConcatDataset([self, other])


class Subset(Dataset):
    """The samples of ``dataset`` at ``indices`` (a batched view: one read per batch)."""

    def __init__(self, dataset: Dataset, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices

    def __getitem__(self, indices: list[int]) -> list[Any]:
        return self.dataset[[int(self.indices[i]) for i in indices]]

    def __len__(self) -> int:
        return len(self.indices)


class ConcatDataset(Dataset):
    """Batched datasets one after another; a batch is one call per dataset it touches.

    Indices may repeat within a batch; negative indices count from the end (as in the original);
    indices outside ``[-len, len)`` raise :class:`IndexError`.
    """

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("ConcatDataset needs at least one dataset")
        for d in self.datasets:
            if not isinstance(d, BatchedDataset):
                raise TypeError(
                    f"ConcatDataset joins batched datasets (ffrecord.torch.Dataset), not {type(d).__name__}"
                )
        self.cumulative_sizes = self.cumsum(self.datasets)

    @staticmethod
    def cumsum(sequence: Iterable[Any]) -> list[int]:
        total, out = 0, []
        for d in sequence:
            total += len(d)
            out.append(total)
        return out

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def _locate(self, index: int) -> tuple[int, int]:
        n = len(self)
        if not -n <= index < n:
            raise IndexError(f"index {index} out of range for a ConcatDataset of {n} samples")
        if index < 0:
            index += n
        d = bisect.bisect_right(self.cumulative_sizes, index)
        return d, index - (self.cumulative_sizes[d - 1] if d else 0)

    def __getitem__(self, indices: list[int]) -> list[Any]:
        # Group by dataset, keeping every position: a repeated index gets its sample each time.
        groups: dict[int, tuple[list[int], list[int]]] = defaultdict(lambda: ([], []))
        for position, index in enumerate(indices):
            d, local = self._locate(int(index))
            groups[d][0].append(position)
            groups[d][1].append(local)
        samples: list[Any] = [None] * len(indices)
        for d, (positions, locals_) in sorted(groups.items()):
            for position, sample in zip(positions, self.datasets[d][locals_], strict=True):
                samples[position] = sample
        return samples
