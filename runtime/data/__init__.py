"""hfai.data: ffrecord-compatible record files with fast batched random reads.

``FileWriter``/``MultiFileWriter`` write ``.ffr`` files byte-compatible with HFAiLab's ffrecord;
``FileReader`` reads them (one file, a list, or a directory of ``*.ffr``) with batched random
reads; ``pack_folder``/``PackedFolder`` aggregate a tree of small files into one record file.
The byte layout is documented in :mod:`hfai.data.layout` and ``docs/data.md``.

This package imports no torch. ``Dataset``, ``BatchedDataset`` and ``DataLoader`` (the torch
integration, in :mod:`hfai.data.dataset`, :mod:`hfai.data.batched` and :mod:`hfai.data.loader`)
are loaded on first access. Batched datasets (``__getitem__`` takes a list of indices, the
ffrecord and ``hfai.datasets`` style) subclass ``BatchedDataset`` and load with ``DataLoader``.
"""

from __future__ import annotations

import importlib
from typing import Any

from hfai.data.errors import ChecksumError, DataError, FormatError, LegacyHeaderWarning, WriterError
from hfai.data.packed import PackedFolder, pack_folder
from hfai.data.reader import FileReader
from hfai.data.writer import FileWriter, MultiFileWriter

_TORCH_ATTRS = {
    "BatchedDataset": "hfai.data.batched",
    "Dataset": "hfai.data.dataset",
    "DataLoader": "hfai.data.loader",
    "ResumableBatchSampler": "hfai.data.loader",
    "SkippingBatchSampler": "hfai.data.loader",
}

__all__ = [
    "ChecksumError",
    "DataError",
    "FileReader",
    "FileWriter",
    "FormatError",
    "LegacyHeaderWarning",
    "MultiFileWriter",
    "PackedFolder",
    "WriterError",
    "pack_folder",
    *_TORCH_ATTRS,
]


def __getattr__(name: str) -> Any:
    # torch takes seconds to import: only the torch-facing classes pay for it, on first use.
    if name in _TORCH_ATTRS:
        value = getattr(importlib.import_module(_TORCH_ATTRS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hfai.data' has no attribute {name!r}")
