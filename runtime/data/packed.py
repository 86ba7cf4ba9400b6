"""Packed folders: a tree of small files aggregated into one ffrecord file, read back by path.

Layout (the original ffrecord's): samples 0..N-1 are the files' bytes, depth first with each
directory's entries in sorted name order; the last sample is the 9 ASCII bytes ``piouhjgbr``
followed by a pickled ``collections.OrderedDict`` mapping each entry name to its sample index
(a file) or to a nested mapping (a sub-directory).

Reading unpickles that index with an unpickler that only builds dicts, lists, strings and
ints, so even a hostile file cannot run code.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import PurePosixPath

import numpy as np

from hfai.data.errors import FormatError
from hfai.data.reader import FileReader
from hfai.data.writer import FileWriter

logger = logging.getLogger(__name__)

MAGIC = b"piouhjgbr"

# name -> int (sample index) | Tree. Built as an OrderedDict (the pickled index keeps file order);
# a decoded index is whatever mapping the file holds.
Tree = dict


def scan_tree(root: str) -> tuple[Tree, list[str]]:
    """The index of ``root`` and the file paths in sample order.

    Regular files (and links to them) become samples; other entries (sockets, broken links,
    links to directories, which could loop) are skipped with a warning.
    """
    files: list[str] = []

    def walk(directory: str) -> Tree:
        tree: Tree = OrderedDict()
        for entry in sorted(os.scandir(directory), key=lambda e: e.name):
            if entry.is_dir(follow_symlinks=False):
                tree[entry.name] = walk(entry.path)
            elif entry.is_file():
                tree[entry.name] = len(files)
                files.append(entry.path)
            else:
                logger.warning("skipping %s: not a regular file or directory", entry.path)
        return tree

    return walk(root), files


def pack_folder(
    src_dir: str | os.PathLike,
    out: str | os.PathLike,
    verbose: bool = False,
    *,
    index: bool = True,
    progress: Callable[[int], None] | None = None,
    fsync: bool = True,
) -> int:
    """Pack every file under ``src_dir`` into the ffrecord file ``out``; return the file count.

    With ``index=True`` (default) the result is a packed folder, readable by path with
    :class:`PackedFolder` (and by the original ffrecord); with ``index=False`` it holds only the
    files' bytes, so ``FileReader(out).n`` is the file count. ``progress(1)`` is called per file;
    ``verbose=True`` (the original's argument) prints ``index/count path`` per file.
    ``out`` appears only once complete (see :class:`~hfai.data.FileWriter`).
    """
    src = os.fspath(src_dir)
    if not os.path.isdir(src):
        raise NotADirectoryError(f"{src}: not a directory")
    tree, files = scan_tree(src)
    if verbose:
        progress = _printing(files, progress)
    write_packed(out, tree, files, index=index, progress=progress, fsync=fsync)
    return len(files)


def _printing(files: list[str], then: Callable[[int], None] | None) -> Callable[[int], None]:
    """A progress callback printing each packed file's number and path, then calling ``then``."""
    done = 0
    width = len(str(len(files)))

    def report(k: int) -> None:
        nonlocal done
        for path in files[done : done + k]:
            print(f"{done:0{width}d}/{len(files)} {path}", flush=True)
            done += 1
        if then is not None:
            then(k)

    return report


def write_packed(
    out: str | os.PathLike,
    tree: Tree,
    files: list[str],
    *,
    index: bool = True,
    progress: Callable[[int], None] | None = None,
    fsync: bool = True,
) -> None:
    """Write the output of :func:`scan_tree` to ``out`` (see :func:`pack_folder`)."""
    with FileWriter(out, len(files) + int(index), fsync=fsync) as writer:
        for path in files:
            with open(path, "rb") as f:
                writer.write_one(f.read())
            if progress is not None:
                progress(1)
        if index:
            writer.write_one(MAGIC + pickle.dumps(tree, protocol=4))


def is_packed_folder(reader: FileReader) -> bool:
    """Is ``reader`` one packed folder, i.e. is its last sample the path index and not data? Only
    the marker is checked (cheap even for a huge index; :func:`decode_index` checks the rest)."""
    if len(reader.paths) != 1 or reader.n == 0:
        return False
    return reader.read_one(reader.n - 1)[: len(MAGIC)].tobytes() == MAGIC


class _IndexUnpickler(pickle.Unpickler):
    """Builds only plain containers: the one class a packed-folder index needs is OrderedDict."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        raise pickle.UnpicklingError(f"packed-folder index may not contain {module}.{name}")


def decode_index(meta: bytes, path: str) -> Tree:
    """Decode the last sample of a packed folder; :class:`FormatError` if it is not one."""
    if len(meta) <= len(MAGIC) or meta[: len(MAGIC)] != MAGIC:
        raise FormatError(f"{path}: not a packed folder (its last sample lacks the index marker)")
    try:
        tree = _IndexUnpickler(io.BytesIO(meta[len(MAGIC) :])).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise FormatError(f"{path}: corrupt packed-folder index: {e}") from e
    if not isinstance(tree, dict):
        raise FormatError(f"{path}: corrupt packed-folder index (not a mapping)")
    return tree


class PackedFolder:
    """Read files of a packed folder by their path inside the packed tree (``"a/b.jpg"``).

    Returns uint8 arrays like :meth:`FileReader.read`. Missing paths raise
    :class:`FileNotFoundError`, directories passed as files :class:`IsADirectoryError`.
    """

    def __init__(self, path: str | os.PathLike, check_data: bool = True, **reader_options):
        self.path = os.fspath(path)
        self.reader = FileReader(self.path, check_data, **reader_options)
        try:
            if self.reader.n == 0:
                raise FormatError(f"{self.path}: not a packed folder (no samples)")
            self.tree = decode_index(self.reader.read_one(self.reader.n - 1).tobytes(), self.path)
        except BaseException:
            self.reader.close()
            raise

    def num_files(self) -> int:
        return self.reader.n - 1

    def _lookup(self, name: str | os.PathLike):
        node = self.tree
        for part in PurePosixPath(os.fspath(name)).parts:
            if not isinstance(node, dict) or part not in node:
                raise FileNotFoundError(f"{name}: not in packed folder {self.path}")
            node = node[part]
        return node

    def index_of(self, name: str | os.PathLike) -> int:
        """The sample index of file ``name``."""
        node = self._lookup(name)
        if isinstance(node, dict):
            raise IsADirectoryError(f"{name}: a directory in packed folder {self.path}")
        return int(node)

    def read_one(self, name: str | os.PathLike) -> np.ndarray:
        return self.reader.read_one(self.index_of(name))

    def read(self, names: Sequence[str | os.PathLike]) -> list[np.ndarray]:
        return self.reader.read([self.index_of(n) for n in names])

    def exists(self, name: str | os.PathLike) -> bool:
        try:
            self._lookup(name)
        except FileNotFoundError:
            return False
        return True

    def is_file(self, name: str | os.PathLike) -> bool:
        return self.exists(name) and not isinstance(self._lookup(name), dict)

    def is_dir(self, name: str | os.PathLike) -> bool:
        return self.exists(name) and isinstance(self._lookup(name), dict)

    @property
    def structure(self) -> Tree:
        """The path index (the original's name for :attr:`tree`)."""
        return self.tree

    def list(
        self,
        name: str | os.PathLike | None = None,
        list_file: bool = True,
        list_dir: bool = True,
        recursive: bool = False,
        *,
        files: bool | None = None,
        dirs: bool | None = None,
    ) -> list[str]:
        """Entry names under directory ``name`` (``None`` or ``""``: the root), in sample order.

        ``list_file``/``list_dir`` (the original's names; ``files``/``dirs`` are the same)
        choose files and directories. With ``recursive=True`` the names are paths relative to
        ``name`` (strings, ``/``-separated).
        """
        files = list_file if files is None else files
        dirs = list_dir if dirs is None else dirs
        name = "" if name is None else name
        node = self._lookup(name)
        if not isinstance(node, dict):
            raise NotADirectoryError(f"{name}: a file in packed folder {self.path}")
        out: list[str] = []
        for child, sub in node.items():
            is_dir = isinstance(sub, dict)
            if (dirs and is_dir) or (files and not is_dir):
                out.append(child)
            if recursive and is_dir:
                below = self.list(f"{name}/{child}" if name else child, files=files, dirs=dirs, recursive=True)
                out.extend(f"{child}/{p}" for p in below)
        return out

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> PackedFolder:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
