"""``hfai data convert ltsf SRC DST``: Autoformer-style CSV time series into ffrecord.

SRC is a CSV file (or a folder of ``*.csv``) as the Autoformer repository ships them
(``ETTh1.csv``, ``electricity.csv``, ...): a header row, a first column ``date``
(``YYYY-MM-DD HH:MM[:SS]``, or unpadded ``Y/M/D H:MM`` as in ``exchange_rate.csv``) and numeric
columns after it. No public converter defines the
layout; this one writes ``DST/LTSF/<name>.ffr`` (name: the file's stem), one file of 3 samples:

- 0: UTF-8 JSON ``{"columns": [...], "rows": R, "source": "<file name>"}``;
- 1: the values, float64 little-endian, ``R x len(columns)`` row-major;
- 2: the timestamps, int64 little-endian seconds since 1970-01-01 (naive, no time zone).
"""

from __future__ import annotations

import csv
import json
import re
from datetime import datetime
from pathlib import Path

import numpy as np

from hfai.data.writer import FileWriter
from hfai.datasets.convert_common import NoProgress, Progress, refuse_existing
from hfai.datasets.errors import ConvertError

EPOCH = datetime(1970, 1, 1)
# Autoformer's exchange_rate.csv writes "1990/1/1 0:00": unpadded, with slashes (what a spreadsheet
# saves), which datetime.fromisoformat refuses. Either separator, any padding, optional time.
_LOOSE_DATE = re.compile(r"(\d{4})[-/](\d{1,2})[-/](\d{1,2})(?:[ T](\d{1,2}):(\d{2})(?::(\d{2}))?)?")


def parse_date(text: str) -> datetime:
    """A CSV's date: ISO 8601, or the unpadded ``Y/M/D H:MM[:SS]`` some of the public files use."""
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        match = _LOOSE_DATE.fullmatch(text)
        if match is None:
            raise
        year, month, day, hour, minute, second = (int(g) for g in match.groups(default="0"))
        return datetime(year, month, day, hour, minute, second)


def read_csv(path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(columns, values R x C float64, timestamps R int64 seconds)`` of one series CSV."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if not header or header[0].strip().lower() != "date" or len(header) < 2:
            raise ConvertError(f"{path}: the first row must be a header 'date,<column>,...', got {header!r}")
        columns = [h.strip() for h in header[1:]]
        stamps, values = [], []
        for number, row in enumerate(rows, 2):
            if not row:
                continue
            if len(row) != len(header):
                raise ConvertError(f"{path}:{number}: {len(row)} fields, the header has {len(header)}")
            try:
                stamp = parse_date(row[0].strip())
            except ValueError as e:
                raise ConvertError(f"{path}:{number}: date {row[0]!r} is not 'YYYY-MM-DD HH:MM:SS' "
                                   f"(or 'Y/M/D H:MM')") from e
            try:
                values.append([float(v) for v in row[1:]])
            except ValueError as e:
                raise ConvertError(f"{path}:{number}: a value is not a number ({e})") from e
            stamps.append(int((stamp.replace(tzinfo=None) - EPOCH).total_seconds()))
    if not values:
        raise ConvertError(f"{path}: no data rows")
    return columns, np.asarray(values, dtype="<f8"), np.asarray(stamps, dtype="<i8")


def convert_ltsf(src: str | Path, dst: str | Path, *, progress: Progress | None = None) -> list[Path]:
    """Convert one CSV, or every ``*.csv`` in a folder; returns the ``.ffr`` files written."""
    src, progress = Path(src), progress or NoProgress()
    if src.is_dir():
        files = sorted(src.glob("*.csv"))
        if not files:
            raise ConvertError(f"{src}: no *.csv files in it")
    elif src.is_file():
        files = [src]
    else:
        raise ConvertError(f"{src}: no such file or directory")
    outs = [Path(dst) / "LTSF" / f"{f.stem}.ffr" for f in files]
    for out in outs:
        refuse_existing(out)
    progress.start(f"LTSF: {len(files)} series", len(files))
    for path, out in zip(files, outs, strict=True):
        columns, values, stamps = read_csv(path)
        header = {"columns": columns, "rows": len(stamps), "source": path.name}
        out.parent.mkdir(parents=True, exist_ok=True)
        with FileWriter(out, 3) as writer:  # published under its name only when complete
            writer.write_one(json.dumps(header).encode())
            writer.write_one(values)
            writer.write_one(stamps)
        progress.advance()
    return outs
