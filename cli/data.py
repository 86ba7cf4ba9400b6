"""``hfai data``: pack, inspect, verify, print and convert ffrecord datasets.

Kept light to import: numpy and ``hfai.data`` are imported inside the commands, never torch.
User mistakes (missing or corrupt files, bad indices) end in a one-line error and exit status 1.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from hfai.cli.errors import user_errors


def _data_errors() -> tuple[type[BaseException], ...]:
    from hfai.data.errors import DataError

    return (DataError, OSError, IndexError)


#: The errors a user can cause become a one-line ``Error: ...`` instead of a traceback; a reader
#: that left (`hfai data info x | head -3`) stops the command quietly (hfai.cli.errors).
_user_errors = user_errors(_data_errors)


@click.group("data")
def data_group() -> None:
    """Pack, inspect, verify and convert ffrecord datasets (.ffr files and directories of them)."""


@data_group.command("pack")
@click.argument("src_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(dir_okay=False))
@click.option("--plain", is_flag=True, help="Write only the files' bytes, without the path index.")
@click.option("--no-fsync", is_flag=True, help="Skip the fsync before publishing OUT (faster, not durable).")
@_user_errors
def pack(src_dir: str, out: str, plain: bool, no_fsync: bool) -> None:
    """Aggregate every file under SRC_DIR into the ffrecord file OUT.

    By default OUT is a packed folder (files readable by path, e.g. with hfai.data.PackedFolder);
    with --plain sample i is the i-th file in sorted depth-first order. OUT appears only when
    complete.
    """
    from hfai.data.packed import scan_tree, write_packed

    tree, files = scan_tree(src_dir)
    label = f"packing {len(files)} files"
    with click.progressbar(length=len(files), label=label, file=sys.stderr) as bar:
        write_packed(out, tree, files, index=not plain, progress=bar.update, fsync=not no_fsync)
    click.echo(f"{out}: {len(files)} files packed" + ("" if plain else " (packed folder)"))


@data_group.command("info")
@click.argument("path", type=click.Path())
@_user_errors
def info(path: str) -> None:
    """Show the .ffr files, sample count and sizes of an ffrecord file or directory."""
    from hfai.data.packed import is_packed_folder
    from hfai.data.reader import FileReader

    with FileReader(path, check_data=False) as reader:
        lengths = reader.sample_lengths()
        packed = is_packed_folder(reader)
        click.echo(f"path:          {path}")
        click.echo(f"ffr files:     {len(reader.paths)}")
        # A packed folder's last sample is its path index: say so, or the count looks off by one.
        click.echo(f"samples:       {reader.n}" + (f" ({reader.n - 1} packed files and their path index)"
                                                    if packed else ""))
        click.echo(f"data bytes:    {int(lengths.sum())} ({_human(int(lengths.sum()))})")
        if reader.n:
            low, mean, high = int(lengths.min()), float(lengths.mean()), int(lengths.max())
            click.echo(f"sample bytes:  min {low}, mean {mean:.1f}, max {high}")
        legacy = reader.legacy_files
        header = f"legacy (checksum 0) in {len(legacy)} file(s)" if legacy else "checksummed"
        click.echo(f"header:        {header}")
        click.echo(f"packed folder: {_packed_summary(reader) if packed else 'no'}")


def _packed_summary(reader) -> str:
    from hfai.data.errors import FormatError
    from hfai.data.packed import decode_index

    try:
        decode_index(reader.read_one(reader.n - 1).tobytes(), reader.paths[0])
    except FormatError as e:
        return f"corrupt index ({e})"
    return f"yes ({reader.n - 1} files)"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


@data_group.command("verify")
@click.argument("path", type=click.Path())
@_user_errors
def verify(path: str) -> None:
    """Check the header and every sample's CRC; report the first bad sample (exit status 1)."""
    from hfai.data.reader import FileReader

    with FileReader(path, check_data=True) as reader:
        with click.progressbar(length=reader.n, label="verifying", file=sys.stderr) as bar:
            reader.validate(progress=bar.update)
        click.echo(f"{path}: OK, {reader.n} samples in {len(reader.paths)} file(s), all checksums match")


@data_group.command("cat")
@click.argument("file", type=click.Path())
@click.argument("index")
@_user_errors
def cat(file: str, index: str) -> None:
    """Write sample INDEX of FILE to stdout, raw. In a packed folder INDEX may be a path."""
    from hfai.data.packed import PackedFolder
    from hfai.data.reader import FileReader

    try:
        i = int(index)
    except ValueError:
        with PackedFolder(file) as folder:
            data = folder.read_one(index)
    else:
        with FileReader(file) as reader:
            data = reader.read_one(i)
    click.echo(data.tobytes(), nl=False)  # bytes go to the binary stdout, unchanged


CONVERT_KINDS = ("imagenet", "clue", "clue-corpus", "ltsf", "coco", "gcc")


class _Bar:
    """A :class:`hfai.datasets.convert_common.Progress` drawn with click's progress bar on stderr."""

    def __init__(self) -> None:
        self._bar: Any = None  # a click ProgressBar while a phase runs

    def start(self, label: str, total: int) -> None:
        self.finish()
        self._bar = click.progressbar(length=total, label=label, file=sys.stderr)
        self._bar.__enter__()

    def advance(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


@data_group.command("convert")
@click.argument("kind", type=click.Choice(CONVERT_KINDS))
@click.argument("src", type=click.Path(exists=True))
@click.argument("dst", type=click.Path(file_okay=False))
# Parts are named PART_%05d.ffr: at most 100000 of them keep their names' order the parts' order.
@click.option("--nfiles", type=click.IntRange(1, 100_000),
              help="Parts per split (imagenet: 150 train, 10 val; else 1).")
@click.option("--encoded", is_flag=True, help="imagenet: keep the files' encoded bytes (smaller; this platform only).")
@click.option("--miniset", is_flag=True, help="imagenet: write DST/mini/ImageNet (what miniset=True reads).")
@click.option("--split", type=click.Choice(("train", "val")), default="train", show_default=True,
              help="gcc: the split the index is.")
@click.option("--task", help="clue: the task name (default: SRC's folder name without _public).")
@click.option("--vocab", type=click.Path(exists=True, dir_okay=False), help="clue: vocabulary file, a token a line.")
# Token ids are stored as int32; a sequence is padded to max_length in every batch.
@click.option("--vocab-size", type=click.IntRange(6, 2**31 - 1), default=8021, show_default=True,
              help="clue: size of a vocabulary built from the text (when there is none).")
@click.option("--max-length", type=click.IntRange(3, 1 << 20), default=128, show_default=True,
              help="clue: tokens per sequence, [CLS] and [SEP] included.")
@_user_errors
def convert(kind: str, src: str, dst: str, nfiles: int | None, encoded: bool, miniset: bool, split: str,
            task: str | None, vocab: str | None, vocab_size: int, max_length: int) -> None:
    """Convert public dataset files at SRC into the hfai.datasets layout under the data directory DST.

    \b
    imagenet     SRC/{train,val}/<class>/<images> (torchvision ImageFolder) -> DST/ImageNet/
    clue         a CLUE task folder (train.json, dev.json, test.json, labels.json) -> DST/CLUE/<task>/
    clue-corpus  a .txt file or folder of them, a passage a line -> DST/CLUE/corpus.ffr
    ltsf         an Autoformer CSV (date,<columns>...) or folder of them -> DST/LTSF/<name>.ffr
    coco         SRC/{train2017,val2017}/ and SRC/annotations/ -> DST/COCO/
    gcc          a TSV index (title, filepath) of Conceptual Captions -> DST/GoogleConceptualCaption/

    Jobs read DST through HFAI_DATASETS_DIR (hfai dataset add) or hfai.datasets.set_data_dir(DST).
    A split appears only when complete; an existing one is refused.
    """
    bar = _Bar()
    try:
        written = _convert(kind, src, dst, bar, nfiles=nfiles, encoded=encoded, miniset=miniset, split=split,
                           task=task, vocab=vocab, vocab_size=vocab_size, max_length=max_length)
    finally:
        bar.finish()
    for path in written:
        click.echo(f"wrote {path}")


def _convert(kind: str, src: str, dst: str, bar: _Bar, *, nfiles, encoded, miniset, split, task, vocab,
             vocab_size, max_length) -> list:
    if kind == "imagenet":
        from hfai.datasets.convert_imagenet import convert_imagenet

        return convert_imagenet(src, dst, nfiles=nfiles, encoded=encoded, miniset=miniset, progress=bar)
    if kind in ("clue", "clue-corpus"):
        from hfai.datasets.convert_clue import convert_clue_corpus, convert_clue_task

        options = dict(vocab=vocab, vocab_size=vocab_size, max_length=max_length, nfiles=nfiles or 1, progress=bar)
        if kind == "clue":
            return convert_clue_task(src, dst, task=task, **options)
        return convert_clue_corpus(src, dst, **options)
    if kind in ("coco", "gcc"):
        from hfai.datasets.convert_captions import convert_coco, convert_gcc

        if kind == "coco":
            return convert_coco(src, dst, nfiles=nfiles, progress=bar)
        return convert_gcc(src, dst, split=split, nfiles=nfiles or 1, progress=bar)
    from hfai.datasets.convert_ltsf import convert_ltsf

    return convert_ltsf(src, dst, progress=bar)


data = data_group  # the attribute hfai.cli.main's lazy loader looks up
