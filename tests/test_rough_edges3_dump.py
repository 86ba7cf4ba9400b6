"""``ffrecord.utils.dump`` into a folder that already holds other files (issue 39 item 2).

HFAiLab's ffrecord_converters (``dataset_converter/imagenet.py``) make the output folder with
``exist_ok=True``, write ``meta.pkl`` into it and then call ``dump(dataset=..., fname=out_dir,
nfiles=..., verbose=True)``. The converter itself needs torchvision's ImageNet; these tests make the
same calls in the same order on a small dataset of pickled samples."""

from __future__ import annotations

import pickle

import pytest
from ffrecord import FileReader
from ffrecord.utils import dump

from hfai.data import WriterError


class Pickled:
    """What the converter's ImageNetReader is to dump: a Sequence of pickled samples."""

    def __len__(self):
        return 7

    def __getitem__(self, i):
        if i >= 7:
            raise ValueError(i)
        return pickle.dumps({"image": i})


def _convert_like_the_imagenet_converter(out_dir, nfiles):
    out_dir.mkdir(exist_ok=True, parents=True)
    with open(out_dir / "meta.pkl", "wb") as fp:
        pickle.dump({"targets": list(range(7))}, fp)
    dump(dataset=Pickled(), fname=out_dir, nfiles=nfiles, verbose=True)


def test_the_converter_s_meta_file_and_the_parts_share_the_folder(tmp_path):
    out = tmp_path / "imagenet" / "val.ffr"
    _convert_like_the_imagenet_converter(out, nfiles=3)
    assert sorted(p.name for p in out.iterdir()) == ["PART_00000.ffr", "PART_00001.ffr", "PART_00002.ffr",
                                                     "meta.pkl"]
    with FileReader(out) as reader:
        assert [pickle.loads(b) for b in reader.read(list(range(7)))] == [{"image": i} for i in range(7)]
    assert pickle.loads((out / "meta.pkl").read_bytes()) == {"targets": list(range(7))}
    assert [p.name for p in (tmp_path / "imagenet").iterdir()] == ["val.ffr"]  # no temporary left


def test_a_second_dump_into_the_same_folder_is_refused_and_leaves_it_as_it_was(tmp_path):
    out = tmp_path / "val.ffr"
    _convert_like_the_imagenet_converter(out, nfiles=2)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(WriterError, match=r"already holds ffrecord files \(PART_00000.ffr and 1 more\)"):
        dump(Pickled(), out, nfiles=5)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["val.ffr"]


def test_a_file_where_the_folder_should_be_is_refused(tmp_path):
    (tmp_path / "val.ffr").write_bytes(b"not a folder")
    with pytest.raises(WriterError, match="is not a directory"):
        dump(Pickled(), tmp_path / "val.ffr", nfiles=2)
