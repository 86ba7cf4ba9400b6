"""``hfai data convert clue`` and ``clue-corpus``: CLUE JSON lines and a text corpus into ffrecord.

No public converter defines these layouts; this one does (docs/data.md, "hfai.datasets"):

- ``DST/CLUE/vocab.txt``: the vocabulary (:mod:`hfai.datasets.vocab`) every CLUE split uses. Given
  with ``vocab=``, copied; else reused if already there; else built from the source text (the
  specials and the most frequent characters, ``vocab_size`` tokens in all). Convert the corpus
  first, or pass the same vocabulary each time, so that pretraining and fine-tuning agree.
- ``DST/CLUE/<task>/{train,dev,test}.ffr/``: one sample per JSON line of the task's
  ``{split}.json``: int32 token ids ``[CLS] sentence [SEP]`` (or ``[CLS] s1 [SEP] s2 [SEP]`` for
  ``sentence1``/``sentence2`` tasks), at most ``max_length`` tokens, unpadded; plus ``meta.json``
  with ``classes`` (label strings; from ``labels.json`` if the task has one, else the sorted
  labels of train), ``label_descriptions``, ``targets`` (class index per sample, -1 without a
  label, as in test) and ``max_length``.
- ``DST/CLUE/corpus.ffr/``: the pretraining corpus for ``CLUEForMLM``: the lines of every
  ``*.txt`` file under SRC (sorted), tokenized and packed greedily into sequences
  ``[CLS] ... [SEP]`` of at most ``max_length`` tokens (a longer line is cut); ``meta.json``
  holds ``max_length`` and ``vocab_size``.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from hfai.datasets.convert_common import NoProgress, Progress, publish_split, refuse_existing
from hfai.datasets.errors import ConvertError
from hfai.datasets.vocab import Vocab

SPLITS = ("train", "dev", "test")
DEFAULT_VOCAB_SIZE = 8021  # the vocabulary size hfai-models' BERT scripts are built for
DEFAULT_MAX_LENGTH = 128


def clue_root(dst: str | Path) -> Path:
    return Path(dst) / "CLUE"


def resolve_vocab(dst: Path, vocab: str | Path | None, texts: Any, vocab_size: int) -> Vocab:
    """The vocabulary for a conversion into ``dst`` (see the module docstring), saved there."""
    target = clue_root(dst) / "vocab.txt"
    if vocab is not None:
        loaded = Vocab.load(vocab)
        if target.exists() and Vocab.load(target).tokens != loaded.tokens:
            raise ConvertError(f"{target} exists and differs from {vocab}; every CLUE split must share one vocabulary")
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(vocab, target)
        return loaded
    if target.exists():
        return Vocab.load(target)
    built = Vocab.build(texts(), vocab_size)
    target.parent.mkdir(parents=True, exist_ok=True)
    built.save(target)
    return built


# --- tasks (CLUEForCLS) ------------------------------------------------------------------------


def read_json_lines(path: Path) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConvertError(f"{path}:{number}: not a JSON line ({e.msg})") from e
            if not isinstance(row, dict):
                raise ConvertError(f"{path}:{number}: a JSON object per line expected")
            rows.append(row)
    return rows


def sentences(row: dict, where: str) -> tuple[str, str | None]:
    """The text of one CLUE example: ``sentence``, or ``sentence1`` and ``sentence2``."""
    if isinstance(row.get("sentence"), str):
        return row["sentence"], None
    if isinstance(row.get("sentence1"), str) and isinstance(row.get("sentence2"), str):
        return row["sentence1"], row["sentence2"]
    raise ConvertError(
        f"{where}: no 'sentence' (or 'sentence1' and 'sentence2') text; keys are {sorted(row)} "
        "(the single-sentence and sentence-pair CLUE tasks are supported)"
    )


def encode_example(vocab: Vocab, first: str, second: str | None, max_length: int) -> np.ndarray:
    a, b = vocab.encode(first), vocab.encode(second) if second is not None else None
    if b is None:
        ids = [vocab.cls, *a[: max_length - 2], vocab.sep]
    else:
        budget = max_length - 3
        while len(a) + len(b) > budget:  # cut the longer one first, as BERT's pair truncation
            if len(a) >= len(b):
                a.pop()
            else:
                b.pop()
        ids = [vocab.cls, *a, vocab.sep, *b, vocab.sep]
    return np.asarray(ids, dtype="<i4")


def task_classes(src: Path, train_rows: list[dict]) -> tuple[list[str], list[str]]:
    """Label strings and their descriptions: ``labels.json`` if present, else train's labels."""
    labels_file = src / "labels.json"
    if labels_file.exists():
        rows = read_json_lines(labels_file)
        classes = [str(r.get("label")) for r in rows]
        descriptions = [str(r.get("label_des", r.get("label_desc", ""))) for r in rows]
        return classes, descriptions
    found = {str(r["label"]) for r in train_rows if "label" in r}
    if not found:
        raise ConvertError(f"{src}: no labels.json and no 'label' in train.json; cannot tell the classes")
    numeric = all(c.lstrip("-").isdigit() for c in found)
    classes = sorted(found, key=int) if numeric else sorted(found)
    return classes, [""] * len(classes)


def convert_clue_task(
    src: str | Path,
    dst: str | Path,
    *,
    task: str | None = None,
    vocab: str | Path | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    max_length: int = DEFAULT_MAX_LENGTH,
    nfiles: int = 1,
    progress: Progress | None = None,
) -> list[Path]:
    """Convert one CLUE task folder (``train.json``, ``dev.json``, ``test.json``, ``labels.json``).

    ``task`` defaults to the folder's name without a ``_public`` suffix (``iflytek_public`` ->
    ``iflytek``). Returns the split folders written.
    """
    src, dst, progress = Path(src), Path(dst), progress or NoProgress()
    if max_length < 3:
        raise ConvertError(f"max_length must be >= 3, got {max_length}")
    name = task or src.name.removesuffix("_public")
    present = [s for s in SPLITS if (src / f"{s}.json").is_file()]
    if "train" not in present:
        raise ConvertError(f"{src}: no train.json (a CLUE task folder has train.json, dev.json, test.json)")
    out_root = clue_root(dst) / name
    for split in present:
        refuse_existing(out_root / f"{split}.ffr")
    rows = {split: read_json_lines(src / f"{split}.json") for split in present}
    classes, descriptions = task_classes(src, rows["train"])
    index = {c: i for i, c in enumerate(classes)}

    def texts() -> Iterator[str]:
        for split in present:
            for row in rows[split]:
                for text in sentences(row, f"{src / split}.json"):
                    if text is not None:
                        yield text

    words = resolve_vocab(dst, vocab, texts, vocab_size)
    written = []
    for split in present:
        where = f"{src / split}.json"
        targets = []
        for number, row in enumerate(rows[split], 1):
            label = row.get("label")
            if label is not None and str(label) not in index:
                raise ConvertError(
                    f"{where}: example {number}: label {label!r} is not one of the {len(classes)} classes"
                )
            targets.append(index[str(label)] if label is not None else -1)
        samples = (encode_example(words, *sentences(r, where), max_length).tobytes() for r in rows[split])
        meta = {"classes": classes, "label_descriptions": descriptions, "targets": targets,
                "max_length": max_length, "vocab_size": len(words)}
        progress.start(f"CLUE {name} {split}: {len(targets)} examples", len(targets))
        out = out_root / f"{split}.ffr"
        publish_split(out, samples, len(targets), nfiles, {"meta.json": json.dumps(meta).encode()}, progress)
        written.append(out)
    return written


# --- corpus (CLUEForMLM) -----------------------------------------------------------------------


def corpus_files(src: Path) -> list[Path]:
    if src.is_file():
        return [src]
    if src.is_dir():
        files = sorted(p for p in src.rglob("*.txt") if p.is_file())
        if files:
            return files
        raise ConvertError(f"{src}: no *.txt files under it (the corpus is plain text, one passage per line)")
    raise ConvertError(f"{src}: no such file or directory")


def corpus_lines(files: list[Path]) -> Iterator[str]:
    for path in files:
        try:
            with open(path, encoding="utf-8") as f:
                for line in f:
                    if line.strip():
                        yield line.strip()
        except UnicodeDecodeError as e:
            raise ConvertError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from e


def pack_sequences(vocab: Vocab, lines: Iterator[str], max_length: int) -> Iterator[np.ndarray]:
    """``[CLS] tokens [SEP]`` sequences of at most ``max_length``, lines packed greedily."""
    budget = max_length - 2
    pending: list[int] = []
    for line in lines:
        ids = vocab.encode(line)
        if pending and len(pending) + len(ids) > budget:
            yield np.asarray([vocab.cls, *pending, vocab.sep], dtype="<i4")
            pending = []
        pending.extend(ids)
        while len(pending) > budget:
            yield np.asarray([vocab.cls, *pending[:budget], vocab.sep], dtype="<i4")
            pending = pending[budget:]
    if pending:
        yield np.asarray([vocab.cls, *pending, vocab.sep], dtype="<i4")


def convert_clue_corpus(
    src: str | Path,
    dst: str | Path,
    *,
    vocab: str | Path | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    max_length: int = DEFAULT_MAX_LENGTH,
    nfiles: int = 1,
    progress: Progress | None = None,
) -> list[Path]:
    """Convert a text corpus (a ``.txt`` file or a folder of them) for ``CLUEForMLM``.

    The text is read twice (once to count the sequences a writer must declare, once to write
    them), so memory stays small for a corpus of any size.
    """
    src, dst, progress = Path(src), Path(dst), progress or NoProgress()
    if max_length < 3:
        raise ConvertError(f"max_length must be >= 3, got {max_length}")
    out = clue_root(dst) / "corpus.ffr"
    refuse_existing(out)
    files = corpus_files(src)
    words = resolve_vocab(dst, vocab, lambda: corpus_lines(files), vocab_size)
    n = sum(1 for _ in pack_sequences(words, corpus_lines(files), max_length))
    if n == 0:
        raise ConvertError(f"{src}: the corpus has no text")
    progress.start(f"CLUE corpus: {n} sequences", n)
    samples = (s.tobytes() for s in pack_sequences(words, corpus_lines(files), max_length))
    meta = {"max_length": max_length, "vocab_size": len(words)}
    publish_split(out, samples, n, nfiles, {"meta.json": json.dumps(meta).encode()}, progress)
    return [out]
