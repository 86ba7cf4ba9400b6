"""`hfai data convert KIND SRC DST`: each kind through click's runner, read back by hfai.datasets;
one-line errors for bad input; and the command never imports torch."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import hfai.datasets as datasets
from hfai.cli.data import data_group
from hfai.datasets import base


def run(*args: str):
    return CliRunner().invoke(data_group, ["convert", *map(str, args)])


def assert_clean_error(result, fragment: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and fragment in errors[0], result.output


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "_data_dir", None)
    datasets.set_data_dir(tmp_path / "datasets")
    return tmp_path / "datasets"


def write_csv(path, rows: int = 40) -> None:
    lines = ["date,a,OT"] + [f"2020-01-{1 + i // 24:02d} {i % 24:02d}:00:00,{i},{i * 2}" for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")


def test_convert_imagenet(tmp_path, data_dir):
    for split in ("train", "val"):
        for k in range(2):
            folder = tmp_path / "src" / split / f"class{k}"
            folder.mkdir(parents=True)
            Image.fromarray(np.full((3, 3, 3), 40 * k, np.uint8)).save(folder / "x.png")
    result = run("imagenet", tmp_path / "src", data_dir, "--nfiles", "1")
    assert result.exit_code == 0, result.output
    assert f"wrote {data_dir / 'ImageNet' / 'train.ffr'}" in result.output
    assert [label for _, label in datasets.ImageNet("val")[[0, 1]]] == [0, 1]
    assert_clean_error(run("imagenet", tmp_path / "src", data_dir), "already exists")


def test_convert_clue_and_corpus(tmp_path, data_dir):
    task = tmp_path / "tnews_public"
    task.mkdir()
    rows = [{"label": "101", "sentence": "新闻"}, {"label": "100", "sentence": "故事"}]
    (task / "train.json").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    (tmp_path / "corpus.txt").write_text("新闻故事\n", encoding="utf-8")
    assert run("clue-corpus", tmp_path / "corpus.txt", data_dir, "--max-length", "6").exit_code == 0
    result = run("clue", task, data_dir, "--max-length", "6")
    assert result.exit_code == 0, result.output
    ds = datasets.CLUEForCLS("tnews", "train")
    vocab = datasets.CLUEForMLM().vocab  # built from the corpus: 事 故 新 闻 (ties by code point)
    assert vocab.tokens[5:] == ["事", "故", "新", "闻"]
    assert ds.classes == ["100", "101"] and ds[[0]][0][0].tolist() == [2, 7, 8, 3, 0, 0]
    assert len(datasets.CLUEForMLM()) == 1
    (task / "dev.json").write_text('{"sentence": "x", "label": "999"}\n', encoding="utf-8")
    assert_clean_error(run("clue", task, tmp_path / "other"), "label '999' is not one of the 2 classes")


def test_convert_ltsf_and_bad_input(tmp_path, data_dir):
    write_csv(tmp_path / "ETTh9.csv")
    result = run("ltsf", tmp_path / "ETTh9.csv", data_dir)
    assert result.exit_code == 0 and f"wrote {data_dir / 'LTSF' / 'ETTh9.ffr'}" in result.output
    (tmp_path / "noheader.csv").write_text("1,2,3\n")
    assert_clean_error(run("ltsf", tmp_path / "noheader.csv", data_dir), "the first row must be a header")
    assert_clean_error(run("clue", tmp_path, data_dir), "no train.json")
    assert run("nope", tmp_path, data_dir).exit_code == 2  # click's usage error for an unknown kind


def test_convert_imports_no_torch(tmp_path):
    write_csv(tmp_path / "s.csv")
    code = (
        "import sys; from hfai.cli.data import data_group; "
        f"data_group.main(['convert', 'ltsf', {str(tmp_path / 's.csv')!r}, {str(tmp_path / 'out')!r}], "
        "standalone_mode=False); print('torch' in sys.modules)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "False"
    assert (tmp_path / "out" / "LTSF" / "s.ffr").is_file()


@pytest.mark.parametrize(("name", "needs"), [("OGB", "torch_geometric"), ("NuScenes", "nuscenes-devkit"),
                                             ("ERA5", "no ERA5 converter")])
def test_refused_datasets_import_and_say_what_is_missing(name, needs):
    cls = getattr(datasets, name)  # `from hfai.datasets import OGB` works
    with pytest.raises(datasets.UnsupportedDatasetError, match=needs):
        cls("ogbn-proteins")
