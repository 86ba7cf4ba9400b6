"""A folder packed with `hfai data pack`, used as a dataset and inspected from the shell (issue 13)."""

from __future__ import annotations

import subprocess
import sys

import hfai_cli
import pytest

from hfai.data import FileWriter
from hfai.data.packed import pack_folder


@pytest.fixture
def packed(tmp_path) -> str:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    for name, data in (("a.txt", b"alpha"), ("b.txt", b"bravo"), ("sub/c.txt", b"charl")):
        (src / name).write_bytes(data)
    out = tmp_path / "packed.ffr"
    assert pack_folder(src, out, fsync=False) == 3
    return str(out)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return hfai_cli.run(args)


def test_a_packed_folder_as_a_dataset_holds_the_files_only(packed):
    pytest.importorskip("torch")
    from hfai.data import Dataset

    ds = Dataset(packed)
    assert len(ds) == 3
    assert [bytes(s) for s in ds.__getitems__([0, 1, 2])] == [b"alpha", b"bravo", b"charl"]
    batches = list(ds.loader(3, num_workers=0))
    assert len(batches) == 1 and sorted(bytes(row.numpy()) for row in batches[0]) == [b"alpha", b"bravo", b"charl"]
    with pytest.raises(IndexError):
        ds[3]  # the path index is not a sample
    with pytest.raises(IndexError):
        ds.__getitems__([0, 3])


def test_a_plain_file_whose_samples_look_nothing_like_an_index_keeps_them_all(tmp_path):
    pytest.importorskip("torch")
    from hfai.data import Dataset

    with FileWriter(tmp_path / "d.ffr", 2) as w:
        w.write_one(b"x")
        w.write_one(b"y")
    assert len(Dataset(str(tmp_path / "d.ffr"))) == 2


def test_info_names_ffr_files_and_the_index(packed):
    r = _cli("data", "info", packed)
    assert r.returncode == 0, r.stderr
    assert "ffr files:     1" in r.stdout and "samples:       4 (3 packed files and their path index)" in r.stdout
    assert "packed folder: yes (3 files)" in r.stdout


@pytest.mark.parametrize("command, extra", [("info", []), ("cat", ["sub/c.txt"])])
def test_a_reader_that_leaves_early_is_no_error(packed, command, extra):
    proc = subprocess.Popen([sys.executable, "-m", "hfai.cli.main", "data", command, packed, *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # like `| head` having read enough before we write
    stderr = proc.stderr.read()
    assert proc.wait(60) == 141, stderr  # as a tool killed by SIGPIPE
    assert stderr == "", stderr
