"""``hfai.datasets``: the cluster's prepared datasets as ffrecord files (ImageNet, CLUE, LTSF, ...).

Every dataset is batched (``__getitem__`` takes a list of indices and returns a list of items)
and has ``.loader(batch_size, sampler=..., num_workers=..., ...)``, a torch DataLoader with
``set_step`` for resuming mid-epoch. Datasets are read from :func:`get_data_dir` (set with
:func:`set_data_dir` or ``$HFAI_DATASETS_DIR``) and made with ``hfai data convert KIND SRC DST``.
The layouts are described in docs/data.md ("hfai.datasets").

The names below load on first use: the datasets import torch, while the converters
(``hfai.datasets.convert_*``, used by the torch-free ``hfai data convert``) must not.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "BaseDataset": "base",
    "get_data_dir": "base",
    "set_data_dir": "base",
    "register_dataset": "base",
    "ImageNet": "imagenet",
    "CLUEForCLS": "clue",
    "CLUEForMLM": "clue",
    "LTSF": "ltsf",
    "OGB": "unsupported",
    "NuScenes": "unsupported",
    "CocoCaption": "captions",
    "GoogleConceptualCaption": "captions",
    "ERA5": "unsupported",
    "ConvertError": "errors",
    "DatasetError": "errors",
    "DatasetNotFoundError": "errors",
    "MissingPackageError": "errors",
    "UnsupportedDatasetError": "errors",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        value = getattr(importlib.import_module(f"hfai.datasets.{_WHERE[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hfai.datasets' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
