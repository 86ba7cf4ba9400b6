"""Checkpoint helpers: save atomically (temp file, fsync, rename) and find the latest.

A job killed in the middle of a save must never leave a half-written file under the final name:
the next run would resume from garbage. Only rank 0 should save in a distributed job.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

_STEP = re.compile(r"(\d+)")


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on success it is fsynced and renamed onto ``path``."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def save(obj: Any, path: str | os.PathLike, saver: Callable[[Any, str], None] | None = None) -> Path:
    """Save ``obj`` atomically to ``path`` (with ``torch.save`` unless ``saver`` is given)."""
    if saver is None:
        import torch

        saver = torch.save
    with atomic_path(path) as tmp:
        saver(obj, str(tmp))
    return Path(path)


def load(path: str | os.PathLike, loader: Callable[[str], Any] | None = None) -> Any:
    if loader is None:
        import torch

        def loader(p: str) -> Any:
            return torch.load(p, map_location="cpu", weights_only=False)

    return loader(str(path))


def latest(directory: str | os.PathLike, pattern: str = "*.pt") -> Path | None:
    """The checkpoint in ``directory`` with the highest number in its name (then newest mtime)."""
    d = Path(directory)
    if not d.is_dir():
        return None
    candidates = [p for p in d.glob(pattern) if p.is_file() and not p.name.startswith(".")]
    if not candidates:
        return None

    def order(p: Path) -> tuple[int, float]:
        numbers = _STEP.findall(p.stem)
        return (int(numbers[-1]) if numbers else -1, p.stat().st_mtime)

    return max(candidates, key=order)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
