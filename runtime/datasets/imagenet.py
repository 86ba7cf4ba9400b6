"""``ImageNet``: ILSVRC-2012 classification, in the layout of HFAiLab's ffrecord converters.

``<data_dir>/ImageNet/{train,val}.ffr/`` (``<data_dir>/mini/ImageNet/...`` for ``miniset=True``)
holds ``PART_*.ffr`` files whose samples are pickled ``PIL.Image`` objects (or pickled encoded
image bytes, see ``hfai data convert imagenet --encoded``) and ``meta.pkl``, a pickled dict with
``classes``, ``class_to_idx`` and ``targets`` (one int per sample). Both are unpickled: open only
data directories you trust, as with the original.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from hfai.data.reader import FileReader, as_indices
from hfai.datasets.base import BaseDataset, apply, get_data_dir, split_dir
from hfai.datasets.errors import DatasetError, MissingPackageError

HOW = "hfai data convert imagenet SRC DST  (SRC: train/ and val/ folders of class folders of images)"


def image_root(miniset: bool = False) -> Path:
    """``<data_dir>/ImageNet``, or ``<data_dir>/mini/ImageNet`` for the 8-image miniset."""
    return get_data_dir() / ("mini" if miniset else "") / "ImageNet"


def load_pil_image(sample: Any) -> Any:
    """A PIL image from one sample's bytes: a pickled ``PIL.Image`` or pickled encoded bytes."""
    value = pickle.loads(sample)
    if isinstance(value, bytes | bytearray):
        from PIL import Image

        value = Image.open(io.BytesIO(value))
        value.load()
    return value


def require_pil(what: str) -> None:
    try:
        import PIL.Image  # noqa: F401  (unpickling images needs it)
    except ImportError as e:
        raise MissingPackageError("PIL", what, "pillow") from e


class ImageNet(BaseDataset):
    """ImageNet ``split`` ("train" or "val"): items are ``(image, label)``.

    ``image`` is an RGB ``PIL.Image`` passed through ``transform`` if given; ``label`` the class
    index (an int). ``__getitem__`` takes a list of indices and returns a list of items; a
    subclass may call ``super().__getitem__(indices)`` with ``transform=None`` and work on the
    PIL images. ``check_data`` verifies each sample's CRC-32 as it is read.

    Attributes: ``split``, ``transform``, ``data_dir`` (the ``ImageNet`` folder), ``fname`` (the
    split's ``.ffr`` folder), ``reader`` (an :class:`hfai.data.FileReader`), ``meta`` (the dict
    from ``meta.pkl``), ``classes``, ``class_to_idx``, ``targets``.
    """

    def __init__(
        self,
        split: str,
        transform: Callable[[Any], Any] | None = None,
        check_data: bool = True,
        miniset: bool = False,
    ):
        super().__init__()
        require_pil("hfai.datasets.ImageNet")
        self.split = split
        self.transform = transform
        self.data_dir = image_root(miniset)
        self.fname = split_dir(self.data_dir, "ImageNet", split, ("train", "val"), HOW)
        self.meta = _load_meta(self.fname / "meta.pkl")
        self.reader = FileReader(self.fname, check_data)
        self.targets = self.meta["targets"]
        if len(self.targets) != self.reader.n:
            raise DatasetError(
                f"{self.fname}: meta.pkl has {len(self.targets)} targets for {self.reader.n} images; "
                "the split is incomplete, convert it again"
            )
        self.classes = self.meta.get("classes", [])
        self.class_to_idx = self.meta.get("class_to_idx", {})

    def __len__(self) -> int:
        return self.reader.n

    def items(self, indices: Sequence[int]) -> list[Any]:
        idx = as_indices(indices, self.reader.n)
        samples = self.reader.read(idx)
        items = []
        for i, sample in zip(idx.tolist(), samples, strict=True):
            image = load_pil_image(sample).convert("RGB")
            items.append((apply(self.transform, image), int(self.targets[i])))
        return items


def _load_meta(path: Path) -> dict:
    if not path.exists():
        raise DatasetError(f"{path} is missing (the targets of the split); convert the split again")
    with open(path, "rb") as f:
        meta = pickle.load(f)
    if not isinstance(meta, dict) or "targets" not in meta:
        raise DatasetError(f"{path}: not an ImageNet meta file (a dict with 'targets')")
    return meta
