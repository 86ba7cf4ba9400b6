"""``CocoCaption`` and ``GoogleConceptualCaption``: images with their captions.

COCO, in HFAiLab's converter layout: ``<data_dir>/COCO/{train,val}2017.ffr`` (a file or a
folder of ``PART_*.ffr``) of pickled ``PIL.Image`` objects, one per image in ascending image id
(the order of ``torchvision.datasets.CocoDetection``), and ``<data_dir>/COCO/annotations/``
with the original JSON files; captions come from ``captions_{split}2017.json``.

Conceptual Captions (no public converter fixes where it lives; this one does):
``<data_dir>/GoogleConceptualCaption/{train,val}.ffr/PART_*.ffr``, each sample a pickled dict
``{"caption": str, "image_bytes": bytes}`` (the sample format of HFAiLab's googlecc converter).
Samples are unpickled: open only data directories you trust.
"""

from __future__ import annotations

import io
import json
import pickle
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hfai.data.reader import FileReader, as_indices
from hfai.datasets.base import BaseDataset, apply, get_data_dir, split_dir
from hfai.datasets.errors import DatasetError, DatasetNotFoundError
from hfai.datasets.imagenet import load_pil_image, require_pil


def coco_image_ids(annotations: Path, split: str) -> list[int]:
    """The image ids of a COCO split in sample order: ascending, from the instances file (what
    the converter used) or, without it, from the captions file."""
    for name in (f"instances_{split}2017.json", f"captions_{split}2017.json"):
        path = annotations / name
        if path.exists():
            with open(path, encoding="utf-8") as f:
                return sorted(int(image["id"]) for image in json.load(f)["images"])
    raise DatasetNotFoundError(f"COCO {split} annotations", annotations / f"captions_{split}2017.json",
                               "hfai data convert coco SRC DST  (it copies SRC/annotations)")


class CocoCaption(BaseDataset):
    """COCO 2017 captions, split "train" or "val": items ``(image, image_id, annotations)``.

    ``annotations`` is the list of the image's caption records (dicts with ``caption``); with a
    ``transform``, the item is ``transform(image, image_id, annotations)``.
    """

    def __init__(self, split: str, transform: Callable[..., Any] | None = None, check_data: bool = True,
                 miniset: bool = False):
        super().__init__()
        require_pil("hfai.datasets.CocoCaption")
        self.split, self.transform = split, transform
        self.data_dir = get_data_dir() / ("mini" if miniset else "") / "COCO"
        how = "hfai data convert coco SRC DST  (SRC: train2017/, val2017/, annotations/)"
        if split not in ("train", "val"):
            raise ValueError(f"CocoCaption: split must be 'train' or 'val', got {split!r}")
        self.fname = self.data_dir / f"{split}2017.ffr"
        if not self.fname.exists():
            raise DatasetNotFoundError(f"COCO ({split})", self.fname, how)
        annotations = self.data_dir / "annotations"
        self.ids = coco_image_ids(annotations, split)
        captions_file = annotations / f"captions_{split}2017.json"
        if not captions_file.exists():
            raise DatasetNotFoundError(f"COCO {split} captions", captions_file, how)
        with open(captions_file, encoding="utf-8") as f:
            self.captions: dict[int, list[dict]] = defaultdict(list)
            for record in json.load(f)["annotations"]:
                self.captions[int(record["image_id"])].append(record)
        self.reader = FileReader(self.fname, check_data)
        if self.reader.n != len(self.ids):
            raise DatasetError(f"{self.fname}: {self.reader.n} images for {len(self.ids)} image ids in the annotations")

    def __len__(self) -> int:
        return self.reader.n

    def items(self, indices: Sequence[int]) -> list[Any]:
        idx = as_indices(indices, self.reader.n)
        out = []
        for i, sample in zip(idx.tolist(), self.reader.read(idx), strict=True):
            image_id = self.ids[i]
            out.append(apply(self.transform, load_pil_image(sample), image_id, self.captions.get(image_id, [])))
        return out


class GoogleConceptualCaption(BaseDataset):
    """Conceptual Captions, split "train" or "val": items ``(image, caption)`` (RGB PIL image, str),
    or ``transform(image, caption)``."""

    def __init__(self, split: str, transform: Callable[..., Any] | None = None, check_data: bool = True,
                 miniset: bool = False):
        super().__init__()
        require_pil("hfai.datasets.GoogleConceptualCaption")
        self.split, self.transform = split, transform
        self.data_dir = get_data_dir() / ("mini" if miniset else "") / "GoogleConceptualCaption"
        how = "hfai data convert gcc INDEX.tsv DST --split SPLIT  (INDEX: columns title, filepath)"
        self.fname = split_dir(self.data_dir, "GoogleConceptualCaption", split, ("train", "val"), how)
        self.reader = FileReader(self.fname, check_data)

    def __len__(self) -> int:
        return self.reader.n

    def items(self, indices: Sequence[int]) -> list[Any]:
        from PIL import Image

        out = []
        for sample in self.reader.read(as_indices(indices, self.reader.n)):
            unit = pickle.loads(sample)
            if not isinstance(unit, dict) or "image_bytes" not in unit:
                raise DatasetError(f"{self.fname}: a sample is not a {{'caption', 'image_bytes'}} dict")
            image = Image.open(io.BytesIO(unit["image_bytes"])).convert("RGB")
            out.append(apply(self.transform, image, unit.get("caption", "")))
        return out
