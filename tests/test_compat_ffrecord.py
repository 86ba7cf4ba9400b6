"""The ``ffrecord`` package as HFAiLab's users call it (issue 21 §4), served by hfai.data:
imports, FileReader.fnames, dump, checkFsAlign, pack_folder(verbose), PackedFolder.list."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import warnings

import ffrecord
import numpy as np
import pytest
from ffrecord import FileReader, FileWriter, PackedFolder, checkFsAlign, pack_folder
from ffrecord.utils import dump

from hfai.data import WriterError


def test_ffrecord_is_the_projects_reader_and_imports_no_torch():
    code = (
        "import sys, ffrecord, ffrecord.utils, ffrecord.fileio, ffrecord.package, hfai.data\n"
        "print(ffrecord.PROVIDER, ffrecord.FileReader is hfai.data.FileReader,\n"
        "      ffrecord.fileio.FileWriter is hfai.data.FileWriter,\n"
        "      ffrecord.package.PackedFolder is hfai.data.PackedFolder,\n"
        "      callable(ffrecord.utils.dump), 'torch' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["hfai", "True", "True", "True", "True", "False"], r.stderr
    assert isinstance(ffrecord.__version__, str)


def test_file_reader_fnames_lists_the_files_in_global_order(tmp_path):
    for name in ("PART_1.ffr", "PART_0.ffr"):
        with FileWriter(tmp_path / name, 1) as w:
            w.write_one(name.encode())
    r = FileReader(tmp_path)
    assert r.fnames == [str(tmp_path / "PART_0.ffr"), str(tmp_path / "PART_1.ffr")]
    # The original pickles a reader as FileReader(fnames, check_data): same samples after a round trip.
    again = pickle.loads(pickle.dumps(r))
    assert again.fnames == r.fnames and again.read_one(1).tobytes() == b"PART_1.ffr"


@pytest.mark.parametrize(("n", "nfiles", "parts"), [(200, 8, 8), (200, 64, 50), (10, 16, 10)])
def test_dump_to_a_directory_of_parts(tmp_path, n, nfiles, parts):
    samples = [pickle.dumps(i * 2) for i in range(n)]
    out = tmp_path / "new" / "ds"  # parents are created
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dump(samples, out, nfiles=nfiles)
    assert sorted(os.listdir(out)) == [f"PART_{k:05d}.ffr" for k in range(parts)]
    # Fewer parts than asked for: a warning says so. Only dump's own counts: "always" also lets in
    # whatever the collector finalises meanwhile (an earlier test's unclosed socket).
    split = [w for w in caught if "samples split into" in str(w.message)]
    assert bool(split) == (parts != nfiles)
    r = FileReader(out)
    assert [pickle.loads(s) for s in r.read(list(range(r.n)))] == [i * 2 for i in range(n)]
    assert not [p for p in os.listdir(out.parent) if p.startswith(".")]  # no temporary left


def test_dump_single_file_pickles_what_is_not_bytes(tmp_path):
    out = tmp_path / "one.ffr"
    items = [b"raw", np.arange(3, dtype=np.int32), {"label": 7}]
    dump(items, out, 1)
    r = FileReader(out)
    got = r.read([0, 1, 2])
    assert got[0].tobytes() == b"raw"
    assert got[1].tobytes() == np.arange(3, dtype=np.int32).tobytes()  # all 12 bytes
    assert pickle.loads(got[2]) == {"label": 7}


class Failing:
    def __len__(self):
        return 30

    def __getitem__(self, i):
        if i == 23:
            raise RuntimeError("bad sample")
        return b"x"


def test_dump_that_fails_leaves_nothing(tmp_path):
    out = tmp_path / "ds"
    with pytest.raises(WriterError, match="PART_00002"):
        dump(Failing(), out, nfiles=3)
    assert os.listdir(tmp_path) == []


def test_dump_refuses_a_directory_with_files(tmp_path):
    (tmp_path / "stale.ffr").write_bytes(b"")
    with pytest.raises(WriterError, match="already holds ffrecord files"):
        dump([b"a", b"b"], tmp_path, nfiles=2)


def test_check_fs_align_is_false_off_3fs(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"0" * 4096)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert checkFsAlign(fd) is False
    finally:
        os.close(fd)


def test_pack_folder_verbose_and_the_originals_list_arguments(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "d").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"A")
    (src / "d" / "b.txt").write_bytes(b"BB")
    pack_folder(src, tmp_path / "p.ffr", verbose=True)
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"0/2 {src / 'a.txt'}", f"1/2 {src / 'd' / 'b.txt'}"]
    with PackedFolder(tmp_path / "p.ffr") as pf:
        assert pf.list() == ["a.txt", "d"]
        assert pf.list(list_dir=False) == ["a.txt"]
        assert pf.list(None, True, False, True) == ["a.txt", "d/b.txt"]
        assert pf.list(list_file=False) == ["d"]
        assert pf.structure == {"a.txt": 0, "d": {"b.txt": 1}}
        assert pf.read_one("d/b.txt").tobytes() == b"BB"
