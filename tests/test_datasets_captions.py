"""CocoCaption and GoogleConceptualCaption over fake sources converted by the real converters
(function and CLI), read back with their captions in the order the original converters write."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import hfai.datasets as datasets
from hfai.cli.data import data_group
from hfai.datasets import base
from hfai.datasets.convert_captions import convert_coco, convert_gcc
from hfai.datasets.errors import ConvertError, DatasetNotFoundError


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "_data_dir", None)
    datasets.set_data_dir(tmp_path / "datasets")
    return tmp_path / "datasets"


def save(path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((4, 6, 3), value, np.uint8)).save(path, format="PNG")


@pytest.fixture
def coco(tmp_path):
    src = tmp_path / "coco"
    images = [(30, "c.png", 130), (9, "a.png", 109), (12, "b.png", 112)]  # listed out of id order
    for _, name, value in images:
        save(src / "train2017" / name, value)
    listing = [{"id": i, "file_name": name} for i, name, _ in images]
    captions = [{"id": 1, "image_id": 12, "caption": "twelve"}, {"id": 2, "image_id": 30, "caption": "thirty"},
                {"id": 3, "image_id": 12, "caption": "twelve again"}]
    (src / "annotations").mkdir()
    (src / "annotations" / "instances_train2017.json").write_text(json.dumps({"images": listing, "annotations": []}))
    (src / "annotations" / "captions_train2017.json").write_text(json.dumps({"images": listing,
                                                                              "annotations": captions}))
    return src


def test_coco_captions_in_image_id_order(coco, data_dir):
    convert_coco(coco, data_dir, nfiles=2)
    ds = datasets.CocoCaption("train")
    assert len(ds) == 3
    got = [(np.asarray(img)[0, 0, 0].item(), image_id, [a["caption"] for a in anno]) for img, image_id, anno in
           ds[[0, 1, 2]]]
    assert got == [(109, 9, []), (112, 12, ["twelve", "twelve again"]), (130, 30, ["thirty"])]
    # clip-gen's use: transform(img, img_id, anno)
    seen = datasets.CocoCaption(split="train", transform=lambda img, i, anno: (i, len(anno)))[[2, 1]]
    assert seen == [(30, 1), (12, 2)]
    assert (data_dir / "COCO" / "annotations" / "captions_train2017.json").exists()
    with pytest.raises(DatasetNotFoundError, match=str(data_dir / "COCO" / "val2017.ffr")):
        datasets.CocoCaption("val")


def test_gcc_images_and_captions(tmp_path, data_dir):
    save(tmp_path / "gcc" / "img" / "1.png", 50)
    save(tmp_path / "gcc" / "img" / "2.png", 60)
    index = tmp_path / "gcc" / "train.tsv"
    index.write_text("title\tfilepath\na dog\timg/1.png\ntwo cats\timg/2.png\n", encoding="utf-8")
    convert_gcc(index, data_dir)
    ds = datasets.GoogleConceptualCaption("train")
    (img1, text1), (img2, text2) = ds[[0, 1]]
    assert (text1, text2) == ("a dog", "two cats") and img1.mode == "RGB"
    assert np.asarray(img2)[0, 0, 0] == 60
    assert datasets.GoogleConceptualCaption("train", lambda img, text: text.upper())[[1]] == ["TWO CATS"]
    index.write_text("title\tfilepath\nmissing\timg/3.png\n", encoding="utf-8")
    with pytest.raises(ConvertError, match=r"train.tsv:2: .*3.png"):
        convert_gcc(index, data_dir, split="val")
    assert not (data_dir / "GoogleConceptualCaption" / "val.ffr").exists()


def test_cli_coco_and_gcc(coco, tmp_path, data_dir):
    runner = CliRunner()
    result = runner.invoke(data_group, ["convert", "coco", str(coco), str(data_dir)])
    assert result.exit_code == 0 and "COCO" in result.output, result.output
    assert len(datasets.CocoCaption("train")) == 3
    again = runner.invoke(data_group, ["convert", "coco", str(coco), str(data_dir)])
    assert again.exit_code == 1 and again.output.count("Error: ") == 1 and "already exists" in again.output
    save(tmp_path / "g" / "x.png", 1)
    (tmp_path / "g" / "i.tsv").write_text("title\tfilepath\nx\tx.png\n", encoding="utf-8")
    result = runner.invoke(data_group, ["convert", "gcc", str(tmp_path / "g" / "i.tsv"), str(data_dir),
                                        "--split", "val"])
    assert result.exit_code == 0, result.output
    assert datasets.GoogleConceptualCaption("val")[[0]][0][1] == "x"
