"""``hfai data convert imagenet SRC DST``: an ImageFolder tree into the ImageNet ffrecord layout.

SRC holds ``train/`` and/or ``val/``, each a folder per class (``n01440764/``, ...) of image
files: torchvision's ImageNet and ImageFolder layout. DST is a data directory; the result is
``DST/ImageNet/{train,val}.ffr/`` (see :mod:`hfai.datasets.imagenet`), or ``DST/mini/ImageNet``
with ``miniset=True``. Classes are the sorted folder names and ``targets[i]`` the class index of
image ``i``; images are in class order, then file-name order, as torchvision lists them.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from hfai.datasets.convert_common import NoProgress, Progress, pickled_images, publish_split, refuse_existing
from hfai.datasets.errors import ConvertError, MissingPackageError

#: The file endings torchvision's ImageFolder accepts (case-insensitive).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
DEFAULT_NFILES = {"train": 150, "val": 10}  # as HFAiLab's converter splits them


def scan_image_folder(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """The classes (sorted folder names) and ``(image path, class index)`` of an ImageFolder."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ConvertError(f"{root}: no class folders in it (expected {root}/<class>/<image files>)")
    images: list[tuple[Path, int]] = []
    for k, name in enumerate(classes):
        files = sorted(p for p in (root / name).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
        images.extend((p, k) for p in files)
    if not images:
        raise ConvertError(f"{root}: no image files ({', '.join(IMAGE_EXTENSIONS)}) in its class folders")
    return classes, images


def convert_imagenet(
    src: str | Path,
    dst: str | Path,
    *,
    splits: tuple[str, ...] = ("train", "val"),
    nfiles: int | None = None,
    encoded: bool = False,
    miniset: bool = False,
    progress: Progress | None = None,
) -> list[Path]:
    """Convert the ``splits`` found under ``src``; returns the split folders written.

    ``encoded=False`` stores pickled ``PIL.Image`` objects (decoded pixels: what the original
    converter writes, readable by the original ``hfai.datasets``); ``encoded=True`` stores the
    image files' bytes, pickled, several times smaller, decoded when read (this package only).
    """
    try:
        from PIL import Image
    except ImportError as e:
        raise MissingPackageError("PIL", "hfai data convert imagenet", "pillow") from e
    src, progress = Path(src), progress or NoProgress()
    present = [s for s in splits if (src / s).is_dir()]
    if not present:
        raise ConvertError(f"{src}: none of the folders {', '.join(splits)} is there (ImageFolder layout expected)")
    out_root = Path(dst) / ("mini" if miniset else "") / "ImageNet"
    for split in present:
        refuse_existing(out_root / f"{split}.ffr")
    written = []
    for split in present:
        classes, images = scan_image_folder(src / split)
        meta = {
            "classes": classes,
            "class_to_idx": {c: i for i, c in enumerate(classes)},
            "targets": np.array([k for _, k in images], dtype=np.int32),
        }
        progress.start(f"ImageNet {split}: {len(images)} images", len(images))
        out = out_root / f"{split}.ffr"
        parts = nfiles or DEFAULT_NFILES.get(split, 10)
        samples = pickled_images(Image, [p for p, _ in images], encoded=encoded)
        publish_split(out, samples, len(images), parts, {"meta.pkl": pickle.dumps(meta)}, progress)
        written.append(out)
    return written
