"""FileReader behaviour: indices, multi-file datasets, read paths, pickling, fork safety."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import numpy as np
import pytest

from hfai.data import ChecksumError, DataError, FileReader, FileWriter, FormatError, MultiFileWriter, WriterError
from hfai.data.writer import part_sizes


def sample(i: int) -> bytes:
    return f"sample-{i}:".encode() * (i % 4)  # variable lengths, some empty


def write(path, n: int, start: int = 0) -> str:
    with FileWriter(path, n) as w:
        for i in range(start, start + n):
            w.write_one(sample(i))
    return str(path)


@pytest.fixture
def ffr(tmp_path) -> str:
    return write(tmp_path / "d.ffr", 50)


def as_bytes(arrays) -> list[bytes]:
    return [a.tobytes() for a in arrays]


@pytest.mark.parametrize("io", ["auto", "mmap", "pread", "direct"])
def test_all_read_paths_agree(ffr, io):
    idx = [49, 0, 7, 7, 3, 20, 49]
    try:
        r = FileReader(ffr, io=io, threads=3)
        got = r.read(idx)
    except DataError as e:  # O_DIRECT is not supported by every file system (tmpfs)
        pytest.skip(str(e))
    with r:
        assert as_bytes(got) == [sample(i) for i in idx]
        assert r.read_one(5).tobytes() == sample(5)


def test_returned_arrays_are_writable_uint8_and_outlive_the_reader(ffr):
    r = FileReader(ffr)
    a, b = r.read([5, 6])
    r.close()
    assert a.dtype == np.uint8 and a.ndim == 1 and a.flags.writeable
    a[:] = 0  # the caller's copy: changes nothing on disk, and does not touch b
    assert b.tobytes() == sample(6)
    with FileReader(ffr) as again:
        assert again.read_one(5).tobytes() == sample(5)


@pytest.mark.parametrize("bad", [[-1], [50], [0, 51], [10**12]])
def test_out_of_range_and_negative_indices_raise_index_error(ffr, bad):
    with FileReader(ffr) as r:
        with pytest.raises(IndexError):
            r.read(bad)


@pytest.mark.parametrize("bad", [[1.5], ["1"], 3, [[1, 2]]])
def test_non_integer_indices_raise_type_error(ffr, bad):
    with FileReader(ffr) as r:
        with pytest.raises(TypeError):
            r.read(bad)
        with pytest.raises(TypeError):
            r.read_one("3")


def test_indices_may_be_numpy_arrays_and_ranges(ffr):
    with FileReader(ffr) as r:
        assert as_bytes(r.read(np.array([3, 1], dtype=np.uint16))) == [sample(3), sample(1)]
        assert len(r.read(range(50))) == 50 == len(r)


def test_read_returns_a_batch_over_one_buffer(ffr):
    with FileReader(ffr) as r:
        batch = r.read([3, 1, 3])
    assert isinstance(batch, list) and batch.intact()
    assert batch.buffer.tobytes() == sample(3) + sample(1) + sample(3)
    assert batch.bounds == [0, len(sample(3)), len(sample(3)) + len(sample(1)), 2 * len(sample(3)) + len(sample(1))]
    assert batch.uniform_length() is None
    with FileReader(ffr) as r:
        assert r.read([4, 8]).uniform_length() == 0  # i % 4 == 0: empty samples


def test_page_probe_tells_cached_from_dropped_pages(ffr):
    with FileReader(ffr) as r:
        r.validate()  # reads every page
        f = r._files[0]
        end = int(f.header.ends[-1])
        assert f.probe.available and f.probe.resident(0, end)
        os.posix_fadvise(f.fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the writer fsynced: pages are clean
        assert f.probe.resident(0, end) is False
        starts, ends = f.header.offsets[[49, 1]], f.header.ends[[49, 1]]
        assert r._mode(r._files, None, starts, ends) == "pread"  # io=auto sends it to the pool
        assert as_bytes(r.read([49, 1])) == [sample(49), sample(1)]
        r.validate()
        assert r._mode(r._files, None, starts, ends) == "mmap"


def test_closed_reader_refuses_reads_and_closes_twice(ffr):
    r = FileReader(ffr)
    r.close()
    r.close()
    with pytest.raises(DataError, match="closed"):
        r.read([0])


def test_missing_path_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        FileReader(tmp_path / "nope.ffr")


def test_validate_reports_progress_over_all_samples(ffr):
    seen = []
    with FileReader(ffr) as r:
        r.validate(progress=seen.append)
    assert sum(seen) == 50


# -- multi-file datasets -----------------------------------------------------------------


def test_directory_is_read_in_plain_string_order(tmp_path):
    d = tmp_path / "ds"
    d.mkdir()
    # PART_10 sorts before PART_9: global order is 10's samples then 9's.
    write(d / "PART_9.ffr", 3, start=100)
    write(d / "PART_10.ffr", 2, start=200)
    (d / "notes.txt").write_text("ignored")
    with FileReader(d) as r:
        assert r.n == 5
        assert as_bytes(r.read(range(5))) == [sample(i) for i in (200, 201, 100, 101, 102)]
        assert as_bytes(r.read([4, 0, 4, 2])) == [sample(i) for i in (102, 200, 102, 100)]


def test_list_of_files_and_empty_parts(tmp_path):
    a, e, b = write(tmp_path / "a.ffr", 2), write(tmp_path / "e.ffr", 0), write(tmp_path / "b.ffr", 2, start=10)
    with FileReader([b, e, a], io="pread") as r:
        assert as_bytes(r.read([3, 0, 1, 2])) == [sample(i) for i in (1, 10, 11, 0)]


def test_directory_without_ffr_files_is_refused(tmp_path):
    with pytest.raises(FormatError, match="no \\*.ffr"):
        FileReader(tmp_path)


@pytest.mark.parametrize(("n", "nfiles", "sizes"),
                         [(10, 4, [3, 3, 3, 1]), (9, 4, [3, 3, 3]), (4, 4, [1] * 4), (0, 3, [0]), (5, 1, [5])])
def test_part_sizes_follow_the_original(n, nfiles, sizes):
    assert part_sizes(n, nfiles) == sizes


def test_multi_file_writer_round_trip(tmp_path):
    out = tmp_path / "parts"
    with MultiFileWriter(out, 10, 4) as w:
        for i in range(10):
            w.write_one(sample(i))
    assert sorted(os.listdir(out)) == [f"PART_{k:05d}.ffr" for k in range(4)]
    assert sorted(os.listdir(tmp_path)) == ["parts"]  # no temporary directory left
    with FileReader(out) as r:
        assert as_bytes(r.read(range(10))) == [sample(i) for i in range(10)]


def test_multi_file_writer_miscount_leaves_nothing(tmp_path):
    w = MultiFileWriter(tmp_path / "parts", 10, 4)
    for i in range(5):
        w.write_one(sample(i))
    with pytest.raises(WriterError):
        w.close()
    assert os.listdir(tmp_path) == []


# -- pickling and fork ---------------------------------------------------------------------


def test_reader_pickles_and_reopens(ffr):
    with FileReader(ffr, check_data=False, io="pread", threads=2) as r:
        clone = pickle.loads(pickle.dumps(r))
    with clone:
        assert (clone.check_data, clone.io, clone.n) == (False, "pread", 50)
        assert clone.read_one(9).tobytes() == sample(9)


def _read_in_child(reader, queue):
    try:
        queue.put(as_bytes(reader.read([3, 1, 2])))
    except BaseException as e:  # report, so the parent fails with the cause instead of a timeout
        queue.put(repr(e))


@pytest.mark.parametrize("io", ["pread", "mmap"])
def test_reader_opened_before_fork_works_in_the_child(ffr, io):
    ctx = multiprocessing.get_context("fork")
    with FileReader(ffr, io=io, threads=2) as r:
        r.read(range(10))  # start the read threads (pread) before forking
        queue = ctx.Queue()
        child = ctx.Process(target=_read_in_child, args=(r, queue), daemon=True)
        child.start()
        got = queue.get(timeout=30)
        child.join(30)
        assert got == [sample(3), sample(1), sample(2)]
        assert child.exitcode == 0
        assert as_bytes(r.read([1])) == [sample(1)]  # the parent's reader is unaffected


def test_ffrecord_compat_module(ffr):
    from hfai.data import ffrecord

    with ffrecord.FileReader(ffr, True) as r:
        assert r.read_one(2).tobytes() == sample(2)


# -- fixed-size records (the row-gather path) ----------------------------------------------


def fixed(i: int) -> bytes:
    return bytes([i % 251]) * 16


@pytest.mark.parametrize("io", ["auto", "mmap", "pread"])
def test_fixed_size_records_across_parts_with_repeats(tmp_path, io):
    with MultiFileWriter(tmp_path / "parts", 23, 4) as w:
        for i in range(23):
            w.write_one(fixed(i))
    idx = [22, 0, 6, 6, 7, 13, 0, 22, 5]
    with FileReader(tmp_path / "parts", io=io) as r:
        batch = r.read(idx)
        assert as_bytes(batch) == [fixed(i) for i in idx]
        assert batch.uniform_length() == 16 and batch.intact()


def test_fixed_size_record_corruption_is_caught_on_the_row_path(tmp_path):
    path = tmp_path / "fixed.ffr"
    with FileWriter(path, 10) as w:
        for i in range(10):
            w.write_one(fixed(i))
    raw = bytearray(path.read_bytes())
    raw[12 + 12 * 10 + 16 * 7 + 3] ^= 0x40  # a byte of sample 7
    path.write_bytes(bytes(raw))
    with FileReader(path, io="mmap") as r:
        assert r._row_length == 16  # this file does take the row path
        assert as_bytes(r.read([1, 8])) == [fixed(1), fixed(8)]
        with pytest.raises(ChecksumError) as info:
            r.read([2, 7, 9])
        assert info.value.index == 7


def test_multi_file_writer_creates_missing_parents(tmp_path):
    out = tmp_path / "a" / "b" / "ds"
    with MultiFileWriter(out, 3, 2) as w:
        for s in (b"1", b"2", b"3"):
            w.write_one(s)
    assert [x.tobytes() for x in FileReader(out).read([0, 1, 2])] == [b"1", b"2", b"3"]
