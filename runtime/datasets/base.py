"""The data directory and :class:`BaseDataset`, the base of every ``hfai.datasets`` dataset.

The data directory is, in order: the path given to :func:`set_data_dir`, ``$HFAI_DATASETS_DIR``
(what ``hfai dataset`` mounts into jobs, see docs/storage.md), or the original cluster's
``/public_dataset/1/ffdataset``. Each dataset lives in a subdirectory of it (``ImageNet/``,
``CLUE/``, ``LTSF/``) in the layouts described in docs/data.md ("hfai.datasets").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from hfai.data.batched import BatchedDataset
from hfai.datasets.errors import DatasetNotFoundError

if TYPE_CHECKING:
    from hfai.data.loader import DataLoader

ENV_VAR = "HFAI_DATASETS_DIR"
DEFAULT_DATA_DIR = "/public_dataset/1/ffdataset"

_data_dir: Path | None = None


def set_data_dir(path: str | os.PathLike) -> None:
    """Read datasets from ``path`` from now on in this process (overrides ``$HFAI_DATASETS_DIR``)."""
    global _data_dir
    _data_dir = Path(path)


def get_data_dir() -> Path:
    """The directory the datasets are read from (see the module docstring for the order)."""
    if _data_dir is not None:
        return _data_dir
    return Path(os.environ.get(ENV_VAR) or DEFAULT_DATA_DIR)


class BaseDataset(BatchedDataset):
    """A batched map-style dataset: ``__getitem__`` takes a *list* of indices, returns a list.

    The convention of the original ``hfai.datasets`` and of ``ffrecord.torch.Dataset``: a whole
    batch is read at once. The datasets of this package implement :meth:`items`; a user's
    subclass may instead override ``__getitem__(self, indices)`` (and call
    ``super().__getitem__(indices)``), as scripts written for the original do. Either way the
    loader calls ``__getitem__`` once per batch, with a list of ints.
    """

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, indices: Sequence[int]) -> list[Any]:
        """The items at ``indices`` (a list), in order; a single int gives one item, not a list."""
        if isinstance(indices, int | np.integer):
            return self.items([int(indices)])[0]
        return self.items(indices)

    def items(self, indices: Sequence[int]) -> list[Any]:
        """The items at ``indices``, one per index, in order."""
        raise NotImplementedError(f"{type(self).__name__} must define items(indices) or __getitem__(indices)")

    def loader(self, batch_size: int, *args: Any, **kwargs: Any) -> DataLoader:
        """A resumable :class:`hfai.data.DataLoader` over this dataset.

        Arguments as torch's DataLoader (``sampler=``, ``shuffle=``, ``num_workers=``,
        ``pin_memory=``, ``drop_last=``, ...), and as there the order is sequential unless a
        sampler or ``shuffle=True`` says otherwise. A sampler (e.g. ``DistributedSampler``) is
        followed, including the ``set_epoch`` the caller makes on it; ``loader.set_step(k)``
        makes the next iteration skip its first ``k`` batches without reading them. Worker
        processes are forked unless ``multiprocessing_context=`` says otherwise.
        """
        from hfai.data.loader import DataLoader

        if not args and "shuffle" not in kwargs:
            kwargs["shuffle"] = False  # torch's and the original loader's default, not hfai.data's
        if kwargs.get("num_workers") and kwargs.get("multiprocessing_context") is None:
            # Workers are forked, as by the original (ffrecord's loader): under
            # hfai.multiprocessing.spawn the default would be spawn, where every worker
            # imports torch and the script again (seconds each) and pickles the dataset.
            kwargs["multiprocessing_context"] = "fork"
        return DataLoader(self, batch_size, *args, **kwargs)


_REGISTRY: dict[str, type] = {}
T = TypeVar("T", bound=type)


def register_dataset(cls: T) -> T:
    """Class decorator of the original API: records a dataset class by name (no other effect)."""
    _REGISTRY[cls.__name__] = cls
    return cls


def split_dir(root: Path, name: str, split: str, splits: Sequence[str], how: str) -> Path:
    """``root/<split>.ffr`` after checking ``split``; raises DatasetNotFoundError if absent."""
    if split not in splits:
        raise ValueError(f"{name}: split must be one of {', '.join(map(repr, splits))}, got {split!r}")
    path = root / f"{split}.ffr"
    if not path.exists():
        raise DatasetNotFoundError(f"{name} ({split})", path, how)
    return path


def apply(transform: Callable[..., Any] | None, *args: Any) -> Any:
    """``transform(*args)``, or ``args`` unchanged (one value alone) without a transform."""
    if transform is not None:
        return transform(*args)
    return args[0] if len(args) == 1 else args

