"""``LTSF``: the long-term time-series forecasting benchmarks of Informer/Autoformer.

Reads ``<data_dir>/LTSF/<name>.ffr`` (written by ``hfai data convert ltsf``, see
:mod:`hfai.datasets.convert_ltsf`). Windows, splits, scaling and time features follow the
Informer/Autoformer data loaders that LTSF-formers' models are built for:

- splits: ETTh* use 12/4/4 months of hourly rows for train/val/test, ETTm* the same months of
  15-minute rows; other series 70% / 10% / 20%. A split's rows start ``seq_len`` early, so its
  first window's prediction begins at the split's first row.
- features: "S" the target column only, "M" every column, "MS" every column with the target moved
  last (the model predicts it alone).
- scaling: standardized with the mean and std of the train rows (``get_scaler()``).
- items ``(seq_x, seq_y, seq_x_mark, seq_y_mark)``, float32 numpy arrays: ``seq_x`` the
  ``seq_len`` scaled input rows, ``seq_y`` the ``label_len + pred_len`` rows after
  ``seq_len - label_len`` of them: the first ``label_len`` scaled (the decoder's start), the
  ``pred_len`` to predict unscaled when ``inverse=True`` (the default, Informer's ``inverse``
  mode: LTSF-formers compares ``get_scaler().inverse_transform(outputs)`` with them), scaled
  otherwise; ``*_mark`` the 4 time features of those rows (hour of day, day of week, day of
  month, day of year, each in [-0.5, 0.5]: Informer's ``timeF`` encoding for ``freq="h"``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from hfai.data.reader import FileReader, as_indices
from hfai.datasets.base import BaseDataset, get_data_dir
from hfai.datasets.errors import DatasetError, DatasetNotFoundError

SPLITS = ("train", "val", "test")
FEATURES = ("S", "M", "MS")
HOURS_PER_MONTH = 30 * 24


class StandardScaler:
    """``(x - mean) / std`` per column; works on numpy arrays and torch tensors (any device).

    When the data's last dimension is 1 and the scaler has more columns (an "MS" model's
    output), the last column's statistics (the target's) are used.
    """

    def __init__(self, mean: np.ndarray, std: np.ndarray):
        self.mean = np.asarray(mean, dtype=np.float64)
        self.std = np.asarray(std, dtype=np.float64)

    def _stats(self, data: Any) -> tuple[Any, Any]:
        mean, std = self.mean, self.std
        if data.shape[-1] != mean.shape[-1]:
            mean, std = mean[-1:], std[-1:]
        torch = sys.modules.get("torch")  # a tensor means torch is imported; never import it here
        if torch is not None and torch.is_tensor(data):  # the statistics join it on its device
            return (torch.as_tensor(mean, dtype=data.dtype, device=data.device),
                    torch.as_tensor(std, dtype=data.dtype, device=data.device))
        return mean, std

    def transform(self, data: Any) -> Any:
        mean, std = self._stats(data)
        return (data - mean) / std

    def inverse_transform(self, data: Any) -> Any:
        mean, std = self._stats(data)
        return data * std + mean


def split_borders(name: str, rows: int, seq_len: int) -> dict[str, tuple[int, int]]:
    """Row ranges ``[begin, end)`` of train/val/test (Informer's borders)."""
    if name.startswith("ETTh") or name.startswith("ETTm"):
        unit = HOURS_PER_MONTH * (4 if name.startswith("ETTm") else 1)
        train, val, test = 12 * unit, 4 * unit, 4 * unit
        ends = (train, train + val, train + val + test)
        if ends[-1] > rows:
            raise DatasetError(f"LTSF {name}: {rows} rows, the ETT splits need {ends[-1]}")
    else:
        train, test = int(rows * 0.7), int(rows * 0.2)
        ends = (train, rows - test, rows)
    starts = (0, ends[0] - seq_len, ends[1] - seq_len)
    return {s: (max(0, b), e) for s, b, e in zip(SPLITS, starts, ends, strict=True)}


def time_features(stamps: np.ndarray) -> np.ndarray:
    """Informer's hourly ``timeF`` features of int64 epoch seconds, float32 ``(R, 4)``."""
    t = stamps.astype("datetime64[s]")
    days = t.astype("datetime64[D]")
    hour = (t - days).astype(np.int64) // 3600
    weekday = (days.astype(np.int64) + 3) % 7  # 1970-01-01 was a Thursday; Monday = 0
    month_start = days.astype("datetime64[M]").astype("datetime64[D]")
    year_start = days.astype("datetime64[Y]").astype("datetime64[D]")
    day_of_month = (days - month_start).astype(np.int64)  # 0-based
    day_of_year = (days - year_start).astype(np.int64)
    return np.stack(
        [hour / 23.0 - 0.5, weekday / 6.0 - 0.5, day_of_month / 30.0 - 0.5, day_of_year / 365.0 - 0.5],
        axis=1,
    ).astype(np.float32)


class LTSF(BaseDataset):
    """Windows over the series ``name`` ("ETTh1", "electricity", ...); see the module docstring."""

    def __init__(
        self,
        name: str,
        split: str = "train",
        seq_len: int = 96,
        label_len: int = 48,
        pred_len: int = 24,
        features: str = "S",
        target: str = "OT",
        inverse: bool = True,
        check_data: bool = True,
    ):
        super().__init__()
        if split not in SPLITS:
            raise ValueError(f"LTSF: split must be one of {SPLITS}, got {split!r}")
        if features not in FEATURES:
            raise ValueError(f"LTSF: features must be one of {FEATURES}, got {features!r}")
        if min(seq_len, pred_len) < 1 or not 0 <= label_len <= seq_len:
            raise ValueError(f"LTSF: need seq_len, pred_len >= 1 and 0 <= label_len <= seq_len, "
                             f"got {seq_len}, {label_len}, {pred_len}")
        self.name, self.split, self.features, self.target = name, split, features, target
        self.seq_len, self.label_len, self.pred_len, self.inverse = seq_len, label_len, pred_len, inverse
        self.fname = get_data_dir() / "LTSF" / f"{name}.ffr"
        if not self.fname.exists():
            raise DatasetNotFoundError(f"LTSF {name}", self.fname, f"hfai data convert ltsf {name}.csv DST")
        columns, values, stamps = _read_series(self.fname, check_data)
        values, self.columns = _select(columns, values, features, target, self.fname)
        begin, end = split_borders(name, len(values), seq_len)[split]
        train_end = split_borders(name, len(values), seq_len)["train"][1]
        fit = values[:train_end]
        self.scaler = StandardScaler(fit.mean(axis=0), fit.std(axis=0) + 0.0)
        self.scaler.std[self.scaler.std == 0] = 1.0  # a constant column scales to 0, not NaN
        self.raw = values[begin:end].astype(np.float32)
        self.data = self.scaler.transform(values[begin:end]).astype(np.float32)
        self.stamp = time_features(stamps[begin:end])
        self.n = len(self.data) - seq_len - pred_len + 1
        if self.n < 1:
            raise DatasetError(f"LTSF {name} {split}: {len(self.data)} rows, fewer than seq_len + pred_len "
                               f"= {seq_len + pred_len}")

    def get_scaler(self) -> StandardScaler:
        """The scaler fitted on the train rows (``inverse_transform`` undoes the scaling)."""
        return self.scaler

    def __len__(self) -> int:
        return self.n

    def items(self, indices: Sequence[int]) -> list[Any]:
        out = []
        for s in as_indices(indices, self.n).tolist():
            r = s + self.seq_len - self.label_len
            r_end = r + self.label_len + self.pred_len
            future = self.raw if self.inverse else self.data
            seq_y = np.concatenate([self.data[r : r + self.label_len], future[r + self.label_len : r_end]])
            out.append((self.data[s : s + self.seq_len], seq_y, self.stamp[s : s + self.seq_len], self.stamp[r:r_end]))
        return out


def _read_series(path: Any, check_data: bool) -> tuple[list[str], np.ndarray, np.ndarray]:
    with FileReader(path, check_data) as reader:
        if reader.n != 3:
            raise DatasetError(f"{path}: not an LTSF series file (3 samples expected, {reader.n} found)")
        header_bytes, values_bytes, stamps_bytes = reader.read([0, 1, 2])
    header = json.loads(header_bytes.tobytes())
    columns, rows = header["columns"], int(header["rows"])
    values = np.frombuffer(values_bytes, dtype="<f8")
    stamps = np.frombuffer(stamps_bytes, dtype="<i8")
    if values.size != rows * len(columns) or stamps.size != rows:
        raise DatasetError(f"{path}: sizes do not match its header ({rows} rows x {len(columns)} columns)")
    return columns, values.reshape(rows, len(columns)), stamps


def _select(columns: list[str], values: np.ndarray, features: str, target: str, path: Any):
    if target not in columns:
        raise DatasetError(f"{path}: no target column {target!r} (columns: {', '.join(columns)}); pass target=")
    t = columns.index(target)
    if features == "S":
        return values[:, [t]], [target]
    order = [i for i in range(len(columns)) if i != t] + [t]
    return values[:, order], [columns[i] for i in order]
