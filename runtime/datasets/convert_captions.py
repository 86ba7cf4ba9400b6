"""``hfai data convert coco`` and ``gcc``: images with captions into ffrecord.

``coco``: SRC holds ``train2017/``, ``val2017/`` (images) and ``annotations/`` (the JSON files);
writes ``DST/COCO/{split}2017.ffr/`` (pickled ``PIL.Image`` per image, ascending image id, as
HFAiLab's converter) and copies ``annotations/`` to ``DST/COCO/annotations``.

``gcc``: SRC is a tab-separated index with a header and the columns ``title`` and ``filepath``
(the input of HFAiLab's googlecc converter; relative paths are from the index's folder); writes
``DST/GoogleConceptualCaption/{split}.ffr/``, each sample a pickled
``{"caption": str, "image_bytes": bytes}``.
"""

from __future__ import annotations

import csv
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path

from hfai.datasets.convert_common import NoProgress, Progress, pickled_images, publish_split, refuse_existing
from hfai.datasets.errors import ConvertError, MissingPackageError

COCO_NFILES = {"train": 150, "val": 12}


def _pil():
    try:
        from PIL import Image
    except ImportError as e:
        raise MissingPackageError("PIL", "converting images", "pillow") from e
    return Image


def _coco_ids_and_files(annotations: Path, split: str) -> list[tuple[int, str]]:
    import json

    for name in (f"instances_{split}2017.json", f"captions_{split}2017.json"):
        path = annotations / name
        if path.exists():
            try:
                images = json.loads(path.read_text(encoding="utf-8"))["images"]
                return sorted((int(im["id"]), str(im["file_name"])) for im in images)
            except (ValueError, KeyError, TypeError) as e:
                raise ConvertError(f"{path}: not a COCO annotation file with 'images' ({e})") from e
    raise ConvertError(f"{annotations}: neither instances_{split}2017.json nor captions_{split}2017.json")


def convert_coco(src: str | Path, dst: str | Path, *, nfiles: int | None = None,
                 progress: Progress | None = None) -> list[Path]:
    """Convert the COCO 2017 splits found under ``src``; returns the paths written."""
    image_module = _pil()
    src, progress = Path(src), progress or NoProgress()
    annotations = src / "annotations"
    if not annotations.is_dir():
        raise ConvertError(f"{src}: no annotations/ folder (the COCO 2017 layout expected)")
    splits = [s for s in ("train", "val") if (src / f"{s}2017").is_dir()]
    if not splits:
        raise ConvertError(f"{src}: neither train2017/ nor val2017/ is there")
    out_root = Path(dst) / "COCO"
    for target in [out_root / f"{s}2017.ffr" for s in splits] + [out_root / "annotations"]:
        refuse_existing(target)
    written = []
    for split in splits:
        entries = _coco_ids_and_files(annotations, split)
        paths = [src / f"{split}2017" / name for _, name in entries]
        out = out_root / f"{split}2017.ffr"
        progress.start(f"COCO {split}: {len(paths)} images", len(paths))
        publish_split(out, pickled_images(image_module, paths), len(paths), nfiles or COCO_NFILES[split], {},
                      progress)
        written.append(out)
    shutil.copytree(annotations, out_root / "annotations")
    return [*written, out_root / "annotations"]


def convert_gcc(src: str | Path, dst: str | Path, *, split: str = "train", nfiles: int = 1,
                progress: Progress | None = None) -> list[Path]:
    """Convert one Conceptual Captions index (TSV: ``title``, ``filepath``) as ``split``."""
    image_module = _pil()
    src, progress = Path(src), progress or NoProgress()
    if split not in ("train", "val"):
        raise ConvertError(f"split must be 'train' or 'val', got {split!r}")
    out = Path(dst) / "GoogleConceptualCaption" / f"{split}.ffr"
    refuse_existing(out)
    with open(src, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows or not {"title", "filepath"} <= set(rows[0]):
        raise ConvertError(f"{src}: a tab-separated index with the columns 'title' and 'filepath' expected")

    def samples() -> Iterator[bytes]:
        for number, row in enumerate(rows, 2):
            path = src.parent / row["filepath"]
            try:
                data = path.read_bytes()
                with image_module.open(path) as image:
                    image.verify()
            except (OSError, SyntaxError, ValueError) as e:
                raise ConvertError(f"{src}:{number}: {path}: not a readable image ({e})") from e
            yield pickle.dumps({"caption": row["title"], "image_bytes": data})

    progress.start(f"Conceptual Captions {split}: {len(rows)} images", len(rows))
    publish_split(out, samples(), len(rows), nfiles, {}, progress)
    return [out]
