"""hfai.datasets.LTSF over Autoformer-style CSVs converted by the real converter."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import pytest
import torch

import hfai.datasets as datasets
from hfai.datasets import base
from hfai.datasets.convert_ltsf import convert_ltsf
from hfai.datasets.errors import ConvertError, DatasetNotFoundError

START = datetime(2016, 7, 1)  # a Friday, day 183 of a leap year


def series(rows: int) -> np.ndarray:
    i = np.arange(rows, dtype=np.float64)
    return np.stack([i * 0.5, np.sin(i / 5) * 3 + 1, (i % 24) * 2.0], axis=1)  # HUFL, MUFL, OT


def write_csv(path, rows: int, step=timedelta(hours=1)) -> np.ndarray:
    values = series(rows)
    lines = ["date,HUFL,MUFL,OT"]
    lines += [f"{START + k * step:%Y-%m-%d %H:%M:%S},{a!r},{b!r},{c!r}" for k, (a, b, c) in enumerate(values.tolist())]
    path.write_text("\n".join(lines) + "\n")
    return values


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "_data_dir", None)
    datasets.set_data_dir(tmp_path / "datasets")
    return tmp_path / "datasets"


def test_windows_scaling_and_time_features(tmp_path, data_dir):
    values = write_csv(tmp_path / "weather.csv", 200)
    convert_ltsf(tmp_path / "weather.csv", data_dir)
    ds = datasets.LTSF("weather", split="train", seq_len=12, label_len=6, pred_len=4, features="M")
    train_rows = int(200 * 0.7)
    assert len(ds) == train_rows - 12 - 4 + 1 and ds.columns == ["HUFL", "MUFL", "OT"]
    mean, std = values[:train_rows].mean(0), values[:train_rows].std(0)
    x, y, x_mark, y_mark = ds[[5]][0]  # the call LTSF-formers makes: data[[0]][0]
    np.testing.assert_allclose(x, (values[5:17] - mean) / std, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(y[:6], (values[11:17] - mean) / std, rtol=1e-5, atol=1e-6)  # label part scaled
    np.testing.assert_allclose(y[6:], values[17:21], rtol=1e-6)  # the part to predict, unscaled (inverse)
    assert x.dtype == np.float32 and x_mark.shape == (12, 4) and y_mark.shape == (10, 4)
    # row 5 is 2016-07-01 05:00, a Friday: hour 5/23, weekday 4/6, day 0/30, day-of-year 182/365
    np.testing.assert_allclose(x_mark[0], [5 / 23 - 0.5, 4 / 6 - 0.5, -0.5, 182 / 365 - 0.5], rtol=1e-6)
    scaler = ds.get_scaler()
    np.testing.assert_allclose(scaler.inverse_transform(x), values[5:17], rtol=1e-5, atol=1e-5)
    scaled = datasets.LTSF("weather", "train", 12, 6, 4, "M", inverse=False)[[5]][0][1]
    np.testing.assert_allclose(scaled[6:], (values[17:21] - mean) / std, rtol=1e-5, atol=1e-6)


def test_splits_start_seq_len_early(tmp_path, data_dir):
    values = write_csv(tmp_path / "custom.csv", 200)
    convert_ltsf(tmp_path, data_dir)  # a folder of CSVs
    lengths = {s: len(datasets.LTSF("custom", s, 12, 6, 4, "S")) for s in ("train", "val", "test")}
    assert lengths == {"train": 140 - 15, "val": 20 + 12 - 15, "test": 40 + 12 - 15}
    val = datasets.LTSF("custom", "val", 12, 6, 4, "S")
    _, y, _, _ = val[[0]][0]
    assert y[6, 0] == np.float32(values[140, 2])  # the first value to predict is val's first row (OT)


def test_ett_borders_use_months(tmp_path, data_dir):
    write_csv(tmp_path / "ETTm1.csv", 20 * 30 * 24 * 4 + 10, step=timedelta(minutes=15))
    convert_ltsf(tmp_path / "ETTm1.csv", data_dir)
    month = 30 * 24 * 4
    assert len(datasets.LTSF("ETTm1", "train", 96, 48, 24)) == 12 * month - 96 - 24 + 1
    assert len(datasets.LTSF("ETTm1", "test", 96, 48, 24)) == 4 * month + 96 - 96 - 24 + 1


def test_features_and_the_scaler_on_tensors(tmp_path, data_dir):
    values = write_csv(tmp_path / "w.csv", 100)
    convert_ltsf(tmp_path / "w.csv", data_dir)
    x, y, _, _ = datasets.LTSF("w", "train", 8, 4, 4, "S")[[0]][0]
    assert x.shape == (8, 1) and y.shape == (8, 1)
    ms = datasets.LTSF("w", "train", 8, 4, 4, "MS", target="HUFL")
    assert ms.columns == ["MUFL", "OT", "HUFL"]  # the target moved last
    scaler = ms.get_scaler()
    out = torch.zeros(2, 4, 1, dtype=torch.float32)  # an MS model predicts the target alone
    restored = scaler.inverse_transform(out)
    assert restored.dtype == torch.float32
    np.testing.assert_allclose(restored.numpy(), np.full((2, 4, 1), values[:70, 0].mean()), rtol=1e-5)
    with pytest.raises(Exception, match="no target column 'nope'"):
        datasets.LTSF("w", "train", 8, 4, 4, "S", target="nope")


def test_loader_batches_and_bad_input(tmp_path, data_dir):
    write_csv(tmp_path / "w.csv", 60)
    convert_ltsf(tmp_path / "w.csv", data_dir)
    ds = datasets.LTSF("w", "train", 8, 4, 4, "M")
    batches = list(ds.loader(10, drop_last=True))
    assert len(batches) == len(ds) // 10 and [t.shape for t in batches[0]] == [(10, 8, 3), (10, 8, 3), (10, 8, 4),
                                                                              (10, 8, 4)]
    with pytest.raises(ValueError, match="features must be one of"):
        datasets.LTSF("w", "train", 8, 4, 4, "X")
    with pytest.raises(DatasetNotFoundError, match=str(data_dir / "LTSF" / "ETTh1.ffr")):
        datasets.LTSF("ETTh1", "train", 8, 4, 4)
    (tmp_path / "bad.csv").write_text("date,a\n2016-07-01 00:00:00,1.5\n2016-07-01 01:00:00,oops\n")
    with pytest.raises(ConvertError, match=r"bad.csv:3: a value is not a number"):
        convert_ltsf(tmp_path / "bad.csv", data_dir)
    assert not (data_dir / "LTSF" / "bad.ffr").exists()


@pytest.mark.parametrize("first_rows", [
    # The first rows of the public files in their own date formats (exchange_rate.csv is unpadded,
    # with slashes; ETT, electricity, traffic, weather and national_illness are ISO).
    ["1990/1/1 0:00", "1990/1/2 0:00", "1990/1/10 0:00"],
    ["2016-07-01 00:00:00", "2016-07-01 01:00:00", "2016-07-01 02:00:00"],
    ["2020-01-01 00:10:00", "2020-01-01 00:20:00", "2020-01-01 00:30:00"],
    ["2002-01-01 00:00:00", "2002-01-08 00:00:00", "2002-01-15 00:00:00"],
])
def test_the_public_files_date_formats_convert(tmp_path, first_rows):
    from hfai.datasets.convert_ltsf import read_csv

    csv_file = tmp_path / "series.csv"
    csv_file.write_text("date,OT\n" + "".join(f"{d},{k}.5\n" for k, d in enumerate(first_rows)))
    _, values, stamps = read_csv(csv_file)
    want = [datetime.fromisoformat(d.replace("/", "-")) if "/" not in d else
            datetime(*map(int, d.replace(" ", "/").replace(":", "/").split("/"))) for d in first_rows]
    assert stamps.tolist() == [int((w - datetime(1970, 1, 1)).total_seconds()) for w in want]
    assert values[:, 0].tolist() == [0.5, 1.5, 2.5]
    (tmp_path / "bad.csv").write_text("date,OT\n1990/13/1 0:00,1\n")
    with pytest.raises(ConvertError, match="bad.csv:2: date"):
        read_csv(tmp_path / "bad.csv")
