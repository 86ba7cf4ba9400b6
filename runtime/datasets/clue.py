"""``CLUEForCLS`` and ``CLUEForMLM``: CLUE classification tasks and the pretraining corpus.

Layout (written by ``hfai data convert clue`` / ``clue-corpus``, see
:mod:`hfai.datasets.convert_clue`): ``<data_dir>/CLUE/vocab.txt``,
``<data_dir>/CLUE/<task>/{train,dev,test}.ffr/`` and ``<data_dir>/CLUE/corpus.ffr/``, each split a
folder of ``PART_*.ffr`` (int32 token ids per sample) with a ``meta.json``.

Items are ``(seq, mask, label)`` torch tensors, as hfai-models' BERT scripts unpack them:
``seq`` int64 ``[max_length]`` token ids padded with 0 (``[PAD]``); ``mask`` bool
``[max_length]``, True at padding (the ``src_key_padding_mask`` convention); ``label`` an int64
class index (CLS) or int64 ``[max_length]`` with the original ids at the masked positions and
-100 (``CrossEntropyLoss``'s ``ignore_index``) elsewhere (MLM).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hfai.data.reader import FileReader, as_indices
from hfai.datasets.base import BaseDataset, get_data_dir, split_dir
from hfai.datasets.errors import DatasetError, DatasetNotFoundError
from hfai.datasets.vocab import SPECIALS, Vocab

IGNORE_INDEX = -100


def _meta(split: Path) -> dict:
    path = split / "meta.json"
    if not path.exists():
        raise DatasetError(f"{path} is missing; convert the split again")
    return json.loads(path.read_text(encoding="utf-8"))


def _pad(samples: list[np.ndarray], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """Token ids as an int64 ``(B, max_length)`` array padded with 0, and the padding mask."""
    seq = np.zeros((len(samples), max_length), dtype=np.int64)
    lengths = np.empty(len(samples), dtype=np.int64)
    for row, sample in enumerate(samples):
        ids = np.frombuffer(sample, dtype="<i4")[:max_length]
        seq[row, : len(ids)] = ids
        lengths[row] = len(ids)
    mask = np.arange(max_length)[None, :] >= lengths[:, None]
    return seq, mask


class CLUEForCLS(BaseDataset):
    """The CLUE classification task ``dataset_name`` (e.g. "iflytek", "tnews", "afqmc"), split
    "train", "dev" or "test" (test has label -1). Attributes: ``classes`` (label strings),
    ``label_descriptions``, ``targets``, ``max_length``, ``reader``."""

    def __init__(self, dataset_name: str, split: str, check_data: bool = True):
        super().__init__()
        self.dataset_name = dataset_name
        self.split = split
        self.data_dir = get_data_dir() / "CLUE" / dataset_name
        how = f"hfai data convert clue SRC DST  (SRC: the {dataset_name} task folder of train.json, dev.json, ...)"
        self.fname = split_dir(self.data_dir, f"CLUE {dataset_name}", split, ("train", "dev", "test"), how)
        self.meta = _meta(self.fname)
        self.classes: list[str] = self.meta["classes"]
        self.label_descriptions: list[str] = self.meta.get("label_descriptions", [])
        self.targets = np.asarray(self.meta["targets"], dtype=np.int64)
        self.max_length = int(self.meta["max_length"])
        self.reader = FileReader(self.fname, check_data)
        if len(self.targets) != self.reader.n:
            raise DatasetError(f"{self.fname}: meta.json has {len(self.targets)} targets for {self.reader.n} examples")

    def __len__(self) -> int:
        return self.reader.n

    def items(self, indices: Sequence[int]) -> list[Any]:
        idx = as_indices(indices, self.reader.n)
        seq, mask = _pad(self.reader.read(idx), self.max_length)
        labels = self.targets[idx]
        return [
            (torch.from_numpy(seq[k]), torch.from_numpy(mask[k]), torch.tensor(labels[k]))
            for k in range(len(idx))
        ]


class CLUEForMLM(BaseDataset):
    """Masked-language-model pretraining over the CLUE corpus.

    Of each sequence's real tokens (not ``[CLS]``/``[SEP]``/padding) a ``mask_prob`` share (at
    least one) is chosen; of those 80% become ``[MASK]``, 10% a random token, 10% stay. The
    choice is drawn from a generator seeded by ``(seed, index)``: the same sample is masked the
    same way every time it is read, so a resumed job sees exactly the batches it would have seen.
    """

    def __init__(self, mask_prob: float = 0.15, seed: int = 0, check_data: bool = True):
        super().__init__()
        if not 0.0 < mask_prob <= 1.0:
            raise ValueError(f"mask_prob must be in (0, 1], got {mask_prob}")
        self.mask_prob = mask_prob
        self.seed = seed
        self.data_dir = get_data_dir() / "CLUE"
        self.fname = self.data_dir / "corpus.ffr"
        if not self.fname.exists():
            raise DatasetNotFoundError("CLUE corpus", self.fname, "hfai data convert clue-corpus SRC DST  (SRC: *.txt)")
        self.meta = _meta(self.fname)
        self.max_length = int(self.meta["max_length"])
        self.vocab = Vocab.load(self.data_dir / "vocab.txt")
        self.vocab_size = len(self.vocab)
        self._specials = np.array([self.vocab.ids[t] for t in SPECIALS])
        self._ordinary = np.setdiff1d(np.arange(self.vocab_size), self._specials)  # random replacements
        self.reader = FileReader(self.fname, check_data)

    def __len__(self) -> int:
        return self.reader.n

    def items(self, indices: Sequence[int]) -> list[Any]:
        idx = as_indices(indices, self.reader.n)
        seq, mask = _pad(self.reader.read(idx), self.max_length)
        out = []
        for k, index in enumerate(idx.tolist()):
            inputs, label = self._mask(seq[k], index)
            out.append((torch.from_numpy(inputs), torch.from_numpy(mask[k]), torch.from_numpy(label)))
        return out

    def _mask(self, ids: np.ndarray, index: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, index])
        candidates = np.flatnonzero(~np.isin(ids, self._specials))
        label = np.full_like(ids, IGNORE_INDEX)
        inputs = ids.copy()
        if candidates.size == 0:
            return inputs, label
        count = max(1, round(candidates.size * self.mask_prob))
        chosen = rng.choice(candidates, size=count, replace=False)
        label[chosen] = ids[chosen]
        roll = rng.random(count)
        inputs[chosen[roll < 0.8]] = self.vocab.mask
        randomized = chosen[(roll >= 0.8) & (roll < 0.9)]
        if self._ordinary.size:
            inputs[randomized] = rng.choice(self._ordinary, randomized.size)
        return inputs, label
