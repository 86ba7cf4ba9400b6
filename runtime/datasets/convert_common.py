"""What every ``hfai data convert`` converter shares: progress reporting and atomic publishing.

A converted split appears under its final name only when complete (its parts and its meta file
are written in a hidden temporary folder next to it, then renamed), so an interrupted conversion
never leaves a dataset that opens with missing samples. A split that already exists is refused
(delete it to convert again).
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from hfai.data.writer import MultiFileWriter
from hfai.datasets.errors import ConvertError


class Progress(Protocol):
    """Told what a converter is doing: ``start(label, total)`` per phase, ``advance(n)`` as it goes."""

    def start(self, label: str, total: int) -> None: ...

    def advance(self, n: int = 1) -> None: ...


class NoProgress:
    """A :class:`Progress` that shows nothing."""

    def start(self, label: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass


def refuse_existing(path: Path) -> None:
    if path.exists():
        raise ConvertError(f"{path} already exists; remove it first to convert it again")


def publish_split(
    path: Path,
    samples: Iterable[bytes | memoryview],
    n: int,
    nfiles: int,
    extra: dict[str, bytes | Callable[[], bytes]],
    progress: Progress,
) -> None:
    """Write ``n`` samples as ``path/PART_*.ffr`` (at most ``nfiles`` parts) plus the files
    ``extra`` names (contents, or a function called once every sample is written), atomically."""
    refuse_existing(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        staged = tmp / path.name
        with MultiFileWriter(staged, n, nfiles) as writer:
            for sample in samples:
                writer.write_one(sample)
                progress.advance()
        for name, content in extra.items():
            data = content() if callable(content) else content
            (staged / name).write_bytes(data)
        os.chmod(staged, 0o755)
        os.rename(staged, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def pickled_images(image_module, paths: list[Path], *, encoded: bool = False) -> Iterator[bytes]:
    """Each image as the public converters store it: a pickled PIL image, or (``encoded``) its
    file's bytes pickled, checked readable first. ``image_module`` is ``PIL.Image``, imported by the
    caller (converters load PIL only when they run)."""
    for path in paths:
        try:
            if encoded:
                data = path.read_bytes()
                with image_module.open(path) as image:
                    image.verify()  # a broken file fails now, with its name, not in training
                yield pickle.dumps(data)
            else:
                with image_module.open(path) as image:
                    image.load()
                    yield pickle.dumps(image)
        except (OSError, SyntaxError, ValueError) as e:
            raise ConvertError(f"{path}: not a readable image ({e})") from e
