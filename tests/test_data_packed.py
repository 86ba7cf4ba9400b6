"""Packed folders: pack a tree of small files, read them back by path."""

from __future__ import annotations

import pickle
from collections import OrderedDict

import pytest

from hfai.data import FileReader, FileWriter, FormatError, PackedFolder, pack_folder
from hfai.data.packed import MAGIC

TREE = {"b.txt": b"bee", "a/x.bin": b"\x00\x01", "a/deep/y": b"why", "a/empty": b"", "c/z": b"zed"}


@pytest.fixture
def src(tmp_path):
    root = tmp_path / "src"
    for name, data in TREE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    (root / "emptydir").mkdir()
    return root


def test_pack_and_read_by_path(src, tmp_path):
    ticks = []
    assert pack_folder(src, tmp_path / "p.ffr", progress=ticks.append) == len(TREE) == len(ticks)
    with PackedFolder(tmp_path / "p.ffr") as pf:
        assert pf.num_files() == len(TREE)
        for name, data in TREE.items():
            assert pf.read_one(name).tobytes() == data
        assert [a.tobytes() for a in pf.read(["c/z", "b.txt"])] == [b"zed", b"bee"]
        assert pf.list() == ["a", "b.txt", "c", "emptydir"]
        assert pf.list("a", dirs=False) == ["empty", "x.bin"]
        assert pf.list("a", recursive=True, dirs=False) == ["deep/y", "empty", "x.bin"]
        assert pf.is_dir("a/deep") and pf.is_file("a/deep/y") and not pf.exists("a/nope")
        with pytest.raises(FileNotFoundError):
            pf.read_one("a/nope")
        with pytest.raises(IsADirectoryError):
            pf.read_one("a")


def test_index_layout_matches_the_original(src, tmp_path):
    pack_folder(src, tmp_path / "p.ffr")
    with FileReader(tmp_path / "p.ffr") as r:
        meta = r.read_one(r.n - 1).tobytes()
        files = [a.tobytes() for a in r.read(range(r.n - 1))]
    assert meta.startswith(MAGIC)
    index = pickle.loads(meta[len(MAGIC):])
    assert type(index) is OrderedDict
    # depth first, sorted names in each directory
    assert index == {"a": {"deep": {"y": 0}, "empty": 1, "x.bin": 2}, "b.txt": 3, "c": {"z": 4}, "emptydir": {}}
    assert files == [b"why", b"", b"\x00\x01", b"bee", b"zed"]


def test_plain_pack_has_no_index(src, tmp_path):
    pack_folder(src, tmp_path / "plain.ffr", index=False)
    with FileReader(tmp_path / "plain.ffr") as r:
        assert r.n == len(TREE)
    with pytest.raises(FormatError, match="not a packed folder"):
        PackedFolder(tmp_path / "plain.ffr")


class Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def test_index_unpickler_refuses_code(tmp_path):
    path = tmp_path / "evil.ffr"
    with FileWriter(path, 1) as w:
        w.write_one(MAGIC + pickle.dumps({"f": Evil()}))
    with pytest.raises(FormatError, match="builtins.print"):
        PackedFolder(path)
