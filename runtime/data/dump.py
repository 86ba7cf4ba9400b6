"""``dump``: write an indexable collection of samples to one ffrecord file or a directory of parts.

The original ffrecord's ``ffrecord.utils.dump``: ``dataset[i]`` for ``i`` in ``range(len(dataset))``
becomes sample ``i``. Parts are written in parallel by forked processes (the dataset is not
pickled, so it may hold lambdas or open handles), each into a temporary directory next to the
destination; only when every part is complete is the directory renamed onto its name. Where the
destination already holds other files (HFAiLab's converters write ``meta.pkl`` there first), the
complete parts are renamed into it one by one instead.
"""

from __future__ import annotations

import contextlib
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
    ``nfiles`` parts may result (a warning says so); ``fname`` may exist and hold other files, but
    no ``*.ffr`` (:class:`~hfai.data.WriterError` otherwise: a reader of the directory reads every
    ``*.ffr`` in it, so old parts would be overwritten or join the dataset). Missing parent
    directories are created.

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
    _check_destination(path)
    sizes = part_sizes(n, nfiles)
    if len(sizes) != nfiles:
        warnings.warn(f"{path}: {n} samples split into {len(sizes)} files rather than {nfiles}", stacklevel=2)
    tmp_dir = _temp_name(path)
    os.mkdir(tmp_dir, 0o777)  # not mkdtemp: its 0700 mode would stick to the published dataset
    try:
        _write_parts(dataset, sizes, tmp_dir, verbose)
        _publish(tmp_dir, path)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


def _check_destination(path: str) -> None:
    """WriterError unless ``path`` is free for a directory of parts: absent, or a directory
    without ``*.ffr`` files (what a reader of the directory would take for the dataset's)."""
    if not os.path.exists(path):
        return
    if not os.path.isdir(path):
        raise WriterError(f"{path} exists and is not a directory; remove it or dump elsewhere")
    old = sorted(name for name in os.listdir(path) if name.endswith(".ffr"))
    if old:
        more = f" and {len(old) - 1} more" if len(old) > 1 else ""
        raise WriterError(f"{path} already holds ffrecord files ({old[0]}{more}), which would be overwritten or "
                          f"read as part of the dataset; remove them or dump elsewhere")


def _publish(tmp_dir: str, path: str) -> None:
    """Put the complete parts of ``tmp_dir`` at ``path``: the whole directory at once where
    ``path`` is absent or empty, else part by part beside the files already there (on an error
    the parts moved so far are taken back out)."""
    if not os.path.isdir(path) or not os.listdir(path):
        if os.path.isdir(path):
            os.rmdir(path)  # rename cannot replace a directory, even an empty one
        os.rename(tmp_dir, path)
        return
    moved: list[str] = []
    try:
        for name in sorted(os.listdir(tmp_dir)):
            os.rename(os.path.join(tmp_dir, name), os.path.join(path, name))
            moved.append(name)
    except BaseException:
        for name in moved:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(path, name))
        raise
    os.rmdir(tmp_dir)


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
