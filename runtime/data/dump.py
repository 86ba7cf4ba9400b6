"""``dump``: write an indexable collection of samples to one ffrecord file or a directory of parts.

The original ffrecord's ``ffrecord.utils.dump``: ``dataset[i]`` for ``i`` in ``range(len(dataset))``
becomes sample ``i``. Parts are written in parallel by forked processes (the dataset is not
pickled, so it may hold lambdas or open handles), each into a temporary directory next to the
destination; only when every part is complete is the directory renamed onto its name.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import shutil
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from hfai.data.errors import WriterError
from hfai.data.writer import PART_NAME, FileWriter, _temp_name, part_sizes

logger = logging.getLogger(__name__)

MAX_PROCESSES = 16
"""Parts written at once (the original's limit)."""


def dump(dataset: Sequence[Any], fname: str | os.PathLike, nfiles: int, verbose: bool = False) -> None:
    """Write every sample of ``dataset`` (anything with ``len()`` and ``[i]``) to ffrecord files.

    ``nfiles == 1``: one file ``fname`` (replaced if it exists). ``nfiles > 1``: the directory
    ``fname`` of parts ``PART_%05d.ffr`` holding ``ceil(n / nfiles)`` samples each, so fewer than
    ``nfiles`` parts may result (a warning says so); ``fname`` must not exist or be an empty
    directory (:class:`~hfai.data.WriterError` otherwise: stale parts would join the dataset).
    Missing parent directories are created.

    A sample that is bytes-like (bytes, bytearray, memoryview, numpy array) is written as its
    full bytes; anything else is pickled first. An exception while producing a sample aborts
    the whole dump (:class:`~hfai.data.WriterError`), leaving nothing under ``fname``.
    ``verbose`` prints a line per part written.
    """
    if not isinstance(nfiles, int) or isinstance(nfiles, bool) or nfiles < 1:
        raise ValueError(f"nfiles must be an int >= 1, got {nfiles!r}")
    path = os.fspath(fname)
    n = len(dataset)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    if nfiles == 1:
        _write_part(dataset, 0, n, path, verbose)
        return
    if os.path.exists(path) and not (os.path.isdir(path) and not os.listdir(path)):
        raise WriterError(f"{path} exists and is not an empty directory; remove it or dump elsewhere")
    sizes = part_sizes(n, nfiles)
    if len(sizes) != nfiles:
        warnings.warn(f"{path}: {n} samples split into {len(sizes)} files rather than {nfiles}", stacklevel=2)
    tmp_dir = _temp_name(path)
    os.mkdir(tmp_dir, 0o777)  # not mkdtemp: its 0700 mode would stick to the published dataset
    try:
        _write_parts(dataset, sizes, tmp_dir, verbose)
        if os.path.isdir(path):
            os.rmdir(path)  # empty (checked above); rename cannot replace a directory otherwise
        os.rename(tmp_dir, path)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


def _write_parts(dataset: Sequence[Any], sizes: list[int], directory: str, verbose: bool) -> None:
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    tasks = [(starts[k], sizes[k], os.path.join(directory, PART_NAME.format(k))) for k in range(len(sizes))]
    if len(tasks) == 1 or "fork" not in multiprocessing.get_all_start_methods():
        for start, count, part in tasks:
            _write_part(dataset, start, count, part, verbose)
        return
    context = multiprocessing.get_context("fork")
    for i in range(0, len(tasks), MAX_PROCESSES):
        procs = [
            (context.Process(target=_part_process, args=(dataset, *task, verbose), daemon=True), task[2])
            for task in tasks[i : i + MAX_PROCESSES]
        ]
        for proc, _ in procs:
            proc.start()
        for proc, _ in procs:
            proc.join()
        failed = [os.path.basename(part) for proc, part in procs if proc.exitcode != 0]
        if failed:
            raise WriterError(f"writing {', '.join(failed)} failed (see the error printed above); nothing dumped")


def _part_process(dataset: Sequence[Any], start: int, count: int, path: str, verbose: bool) -> None:
    try:
        _write_part(dataset, start, count, path, verbose)
    except BaseException as e:
        print(f"dump: {os.path.basename(path)}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        os._exit(1)


def _write_part(dataset: Sequence[Any], start: int, count: int, path: str, verbose: bool) -> None:
    with FileWriter(path, count) as writer:
        for i in range(start, start + count):
            writer.write_one(_as_buffer(dataset[i]))
    if verbose:
        print(f"{path}: samples {start}..{start + count - 1} written", flush=True)


def _as_buffer(sample: Any) -> Any:
    try:
        memoryview(sample)
    except TypeError:
        return pickle.dumps(sample)
    return sample
