"""hfai.datasets.ImageNet over an ImageFolder converted by the real converter, in the layout of
HFAiLab's ffrecord converters (PART_*.ffr of pickled PIL images + meta.pkl), and the data directory."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from PIL import Image

import hfai.datasets as datasets
from hfai.data import FileReader
from hfai.datasets import base
from hfai.datasets.convert_imagenet import convert_imagenet
from hfai.datasets.errors import ConvertError, DatasetNotFoundError

CLASSES = ("n01", "n02", "n03")


def color(split: str, k: int, i: int) -> tuple[int, int, int]:
    return (10 * k + i, 100 + i, 200 if split == "val" else 50)


@pytest.fixture
def source(tmp_path):
    """An ImageFolder: 3 classes x (3 train, 2 val) solid-colour images of different sizes."""
    src = tmp_path / "src"
    for split, per_class in (("train", 3), ("val", 2)):
        for k, name in enumerate(CLASSES):
            (src / split / name).mkdir(parents=True)
            for i in range(per_class):
                pixels = np.full((5 + i, 7, 3), color(split, k, i), dtype=np.uint8)
                Image.fromarray(pixels).save(src / split / name / f"img_{i}.png")
    (src / "train" / "n01" / "notes.txt").write_text("not an image: skipped")
    return src


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(base, "_data_dir", None)
    out = tmp_path / "datasets"
    datasets.set_data_dir(out)
    return out


def test_converted_imagenet_reads_back_every_image_and_label(source, data_dir):
    convert_imagenet(source, data_dir, nfiles=2)
    train = datasets.ImageNet("train")
    assert len(train) == 9 and train.classes == list(CLASSES)
    items = train[list(range(9))]
    for n, (image, label) in enumerate(items):
        k, i = divmod(n, 3)  # class order, then file-name order, as torchvision lists them
        assert label == k and image.mode == "RGB" and image.size == (7, 5 + i)
        assert np.asarray(image)[0, 0].tolist() == list(color("train", k, i))
    val = datasets.ImageNet("val", transform=lambda im: np.asarray(im)[0, 0].tolist())
    assert val[[5, 0]] == [(list(color("val", 2, 1)), 2), (list(color("val", 0, 0)), 0)]
    assert val[3] == (list(color("val", 1, 1)), 1)  # one int: one item


def test_layout_is_the_original_converters(source, data_dir):
    convert_imagenet(source, data_dir, nfiles=2)
    split = data_dir / "ImageNet" / "train.ffr"
    assert sorted(p.name for p in split.iterdir()) == ["PART_00000.ffr", "PART_00001.ffr", "meta.pkl"]
    meta = pickle.loads((split / "meta.pkl").read_bytes())
    assert meta["classes"] == list(CLASSES) and meta["class_to_idx"] == {"n01": 0, "n02": 1, "n03": 2}
    assert meta["targets"].dtype == np.int32 and meta["targets"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    # what the original reader does with a sample: pickle.loads(bytes).convert("RGB")
    with FileReader(split) as reader:
        image = pickle.loads(reader.read([4])[0]).convert("RGB")
    assert isinstance(image, Image.Image) and np.asarray(image)[0, 0].tolist() == list(color("train", 1, 1))


def test_encoded_miniset(source, data_dir):
    convert_imagenet(source, data_dir, splits=("val",), encoded=True, miniset=True)
    assert (data_dir / "mini" / "ImageNet" / "val.ffr").is_dir()
    val = datasets.ImageNet("val", miniset=True)
    image, label = val[[4]][0]
    assert label == 2 and np.asarray(image)[0, 0].tolist() == list(color("val", 2, 0))
    with pytest.raises(DatasetNotFoundError):
        datasets.ImageNet("val")  # the full set was not converted


def test_not_there_names_the_path_and_the_converter(data_dir):
    with pytest.raises(DatasetNotFoundError) as e:
        datasets.ImageNet("train")
    assert str(data_dir / "ImageNet" / "train.ffr") in str(e.value)
    assert "hfai data convert imagenet" in str(e.value)
    with pytest.raises(ValueError, match="split must be one of"):
        datasets.ImageNet("test")


def test_data_dir_from_the_environment(source, tmp_path, monkeypatch):
    monkeypatch.setattr(base, "_data_dir", None)
    monkeypatch.setenv("HFAI_DATASETS_DIR", str(tmp_path / "mounted"))
    assert datasets.get_data_dir() == tmp_path / "mounted"
    convert_imagenet(source, tmp_path / "mounted", splits=("val",))
    assert len(datasets.ImageNet("val")) == 6


def test_subclass_of_the_original_api_through_the_loader(source, data_dir):
    """clip-gen's pattern: a subclass overrides __getitem__(indices) and calls super()."""
    convert_imagenet(source, data_dir, splits=("train",))

    class Means(datasets.ImageNet):
        def __getitem__(self, indices):
            return [(torch.tensor(np.asarray(im).mean()), label) for im, label in super().__getitem__(indices)]

    loader = Means("train").loader(4)
    labels = [batch[1].tolist() for batch in loader]
    assert labels == [[0, 0, 0, 1], [1, 1, 2, 2], [2]]  # sequential without a sampler, like torch


def test_converter_refuses_bad_sources_and_existing_splits(source, tmp_path, data_dir):
    with pytest.raises(ConvertError, match="none of the folders"):
        convert_imagenet(tmp_path / "src" / "train", data_dir)
    (source / "train" / "n02" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(ConvertError, match="broken.png"):
        convert_imagenet(source, data_dir, splits=("train",))
    assert not (data_dir / "ImageNet" / "train.ffr").exists()  # nothing half-written published
    assert list((data_dir / "ImageNet").iterdir()) == []
    convert_imagenet(source, data_dir, splits=("val",))
    with pytest.raises(ConvertError, match="already exists"):
        convert_imagenet(source, data_dir, splits=("val",))
