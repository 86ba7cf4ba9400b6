"""torch integration: a map-style ``Dataset`` that reads a whole batch in one call.

Importing this module imports torch; ``hfai.data.Dataset`` loads it lazily.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.utils.data

from hfai.data.packed import is_packed_folder
from hfai.data.reader import Batch, FileReader, as_indices

if TYPE_CHECKING:
    from hfai.data.loader import DataLoader


def collate(batch: list[Any]) -> Any:
    """Collate function for raw samples: equal-length uint8 arrays become one ``(B, L)`` tensor.

    torch's ``default_collate`` turns each sample into a tensor and then stacks them, which costs
    more than reading the batch. A batch straight from :meth:`FileReader.read` already lies in one
    contiguous buffer: in the main process it becomes the tensor without a copy, in a worker it is
    copied once into shared memory (as ``default_collate`` does) so that handing it to the main
    process copies nothing. Other lists of equal-length uint8 arrays are stacked with one numpy
    call; anything else goes to ``default_collate``.
    """
    if isinstance(batch, Batch) and batch.intact():
        length = batch.uniform_length()
        if length is not None:
            whole = batch.buffer[batch.bounds[0] : batch.bounds[-1]]
            return _to_tensor(whole.reshape(len(batch), length))
    first = batch[0] if batch else None
    if not (isinstance(first, np.ndarray) and first.dtype == np.uint8 and first.ndim == 1) or not all(
        isinstance(b, np.ndarray) and b.dtype == np.uint8 and b.shape == first.shape for b in batch
    ):
        return torch.utils.data.default_collate(batch)
    return _to_tensor(np.stack(batch))


def _to_tensor(array: np.ndarray) -> torch.Tensor:
    if torch.utils.data.get_worker_info() is None:
        return torch.from_numpy(array)
    out = torch.empty(array.shape, dtype=torch.uint8).share_memory_()
    out.numpy()[...] = array
    return out


class Dataset(torch.utils.data.Dataset):
    """An ffrecord dataset as a ``torch.utils.data.Dataset``.

    ``__getitems__`` (the batch hook of the stock ``torch.utils.data.DataLoader``, torch ≥ 2.0)
    fetches every sample of a batch with one :meth:`FileReader.read`, so the reads run in
    parallel; it works with ``num_workers=0`` and with worker processes started by fork or
    spawn (the reader is fork-safe and picklable). Repeated indices in a batch are fine.

    Each sample is a uint8 numpy array (see :class:`~hfai.data.FileReader`), passed through
    ``transform`` if given. Override :meth:`process` to decode a whole batch at once. The
    default collate function stacks equal-length samples into a uint8 tensor (:func:`collate`
    does the same faster, and is what :meth:`loader` uses); samples of different lengths need a
    ``transform`` or a ``collate_fn``.

    On a packed folder (``hfai data pack``) the samples are the packed files, in sample order;
    the path index stored after them is not one (use :class:`~hfai.data.PackedFolder` to read
    by path).
    """

    def __init__(
        self,
        fnames: str | os.PathLike | Sequence[str | os.PathLike],
        check_data: bool = True,
        transform: Callable[[np.ndarray], Any] | None = None,
        **reader_options,
    ):
        self.reader = FileReader(fnames, check_data, **reader_options)
        self.transform = transform
        try:
            self.n = self.reader.n - 1 if is_packed_folder(self.reader) else self.reader.n
        except BaseException:
            self.reader.close()
            raise

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int | Sequence[int]) -> Any:
        """One sample; a list of indices gives the list of their samples (``ds[[i]]``)."""
        if not isinstance(index, (int, np.integer)):
            return self._read_batch(index)
        as_indices([index], self.n)  # the reader alone would also hand out a packed folder's index
        return self.process([index], [self.reader.read_one(index)])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        if type(self).__getitem__ is not Dataset.__getitem__:
            # A subclass's own __getitem__ decides what a sample is: honour it, one index at a time.
            return [self[i] for i in indices]
        return self._read_batch(indices)

    def _read_batch(self, indices: Sequence[int]) -> list[Any]:
        as_indices(indices, self.n)
        return self.process(indices, self.reader.read(indices))

    def process(self, indices: Sequence[int], samples: list[np.ndarray]) -> list[Any]:
        """Turn the raw samples of one batch into the items the collate function receives."""
        if self.transform is None:
            return samples
        return [self.transform(s) for s in samples]

    def loader(self, batch_size: int, **kwargs) -> DataLoader:
        """A resumable :class:`~hfai.data.loader.DataLoader` over this dataset (see there)."""
        from hfai.data.loader import DataLoader

        return DataLoader(self, batch_size, **kwargs)

    def close(self) -> None:
        self.reader.close()
