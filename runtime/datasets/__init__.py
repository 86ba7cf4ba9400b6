"""``hfai.datasets``: the cluster's prepared datasets as ffrecord files (ImageNet, CLUE, LTSF, ...).

Every dataset is batched (``__getitem__`` takes a list of indices and returns a list of items)
and has ``.loader(batch_size, sampler=..., num_workers=..., ...)``, a torch DataLoader with
``set_step`` for resuming mid-epoch. Datasets are read from :func:`get_data_dir` (set with
:func:`set_data_dir` or ``$HFAI_DATASETS_DIR``) and made with ``hfai data convert KIND SRC DST``.
The layouts are described in docs/data.md ("hfai.datasets"). Importing this package imports torch.
"""

from __future__ import annotations

from hfai.datasets.base import BaseDataset, get_data_dir, register_dataset, set_data_dir
from hfai.datasets.clue import CLUEForCLS, CLUEForMLM
from hfai.datasets.errors import (
    ConvertError,
    DatasetError,
    DatasetNotFoundError,
    MissingPackageError,
    UnsupportedDatasetError,
)
from hfai.datasets.imagenet import ImageNet
from hfai.datasets.ltsf import LTSF
from hfai.datasets.unsupported import ERA5, OGB, CocoCaption, GoogleConceptualCaption, NuScenes

__all__ = [
    "LTSF",
    "OGB",
    "ERA5",
    "BaseDataset",
    "CLUEForCLS",
    "CLUEForMLM",
    "CocoCaption",
    "ConvertError",
    "DatasetError",
    "DatasetNotFoundError",
    "GoogleConceptualCaption",
    "ImageNet",
    "MissingPackageError",
    "NuScenes",
    "UnsupportedDatasetError",
    "get_data_dir",
    "register_dataset",
    "set_data_dir",
]
