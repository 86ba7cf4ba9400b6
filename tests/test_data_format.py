"""hfai.data byte format: golden bytes, round trips, writer guarantees, corrupt files refused."""

from __future__ import annotations

import os
import struct
import warnings
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfai.data import (
    ChecksumError,
    FileReader,
    FileWriter,
    FormatError,
    LegacyHeaderWarning,
    WriterError,
)
from hfai.data.layout import decode_header, encode_header, header_size


def write(path, samples) -> str:
    with FileWriter(path, len(samples)) as w:
        for s in samples:
            w.write_one(s)
    return str(path)


def reference_file(samples: list[bytes], legacy: bool = False) -> bytes:
    """The ffrecord layout built independently of hfai.data, with struct and zlib."""
    n = len(samples)
    offsets, pos = [], 12 + 12 * n
    for s in samples:
        offsets.append(pos)
        pos += len(s)
    body = struct.pack(f"<q{n}I{n}q", n, *[zlib.crc32(s) for s in samples], *offsets)
    meta = 0 if legacy else zlib.crc32(body)
    return struct.pack("<I", meta) + body + b"".join(samples)


# -- golden bytes ------------------------------------------------------------------------


def test_empty_file_is_the_12_golden_bytes(tmp_path):
    path = write(tmp_path / "e.ffr", [])
    assert open(path, "rb").read() == bytes.fromhex("69df2265 0000000000000000")
    with FileReader(path) as r:
        assert r.n == 0 and r.read([]) == []


def test_one_sample_golden_bytes(tmp_path):
    path = write(tmp_path / "a.ffr", [b"abc"])
    assert open(path, "rb").read() == bytes.fromhex("c22ca54c0100000000000000c24124351800000000000000616263")


@pytest.mark.parametrize("n", [1, 2, 3, 8])  # odd and even N: the offsets table is misaligned for even N
def test_written_bytes_match_reference_layout(tmp_path, n):
    samples = [bytes([i]) * (i * 7 % 5) for i in range(n)]  # includes empty samples
    path = write(tmp_path / "f.ffr", samples)
    assert open(path, "rb").read() == reference_file(samples)


def test_reads_files_built_by_reference_layout(tmp_path):
    samples = [b"x" * 5, b"", b"hello", os.urandom(4096)]
    path = tmp_path / "ref.ffr"
    path.write_bytes(reference_file(samples))
    with FileReader(path) as r:
        assert [a.tobytes() for a in r.read(range(4))] == samples


def test_header_encode_decode_roundtrip():
    crcs, offsets = [1, 2, 0xFFFFFFFF], [48, 50, 50]
    blob = encode_header(crcs, offsets)
    assert len(blob) == header_size(3) == 48
    h = decode_header(blob, 60, "mem")
    assert h.checksums.tolist() == crcs and h.offsets.tolist() == offsets
    assert h.lengths.tolist() == [2, 0, 10] and not h.legacy


# -- writer ------------------------------------------------------------------------------


def test_numpy_arrays_are_written_in_full(tmp_path):
    arrays = [np.arange(4, dtype=np.int32), np.ones((3, 5), dtype=np.float64), np.arange(10)[::2]]
    path = write(tmp_path / "np.ffr", arrays)
    with FileReader(path) as r:
        got = r.read([0, 1, 2])
    assert got[0].nbytes == 16 and np.array_equal(got[0].view(np.int32), arrays[0])
    assert np.array_equal(got[1].view(np.float64).reshape(3, 5), arrays[1])
    assert np.array_equal(got[2].view(arrays[2].dtype), arrays[2])  # non-contiguous input


def test_close_with_too_few_samples_raises_and_leaves_no_file(tmp_path):
    path = tmp_path / "short.ffr"
    w = FileWriter(path, 3)
    w.write_one(b"a")
    with pytest.raises(WriterError, match="1 of the declared 3"):
        w.close()
    assert os.listdir(tmp_path) == []


def test_too_many_samples_raises_and_leaves_no_file(tmp_path):
    path = tmp_path / "long.ffr"
    with pytest.raises(WriterError, match="more than the declared 1"):
        with FileWriter(path, 1) as w:
            w.write_one(b"a")
            w.write_one(b"b")
    assert os.listdir(tmp_path) == []


def test_exception_in_with_block_keeps_previous_file(tmp_path):
    path = write(tmp_path / "keep.ffr", [b"old"])
    with pytest.raises(RuntimeError):
        with FileWriter(path, 1):
            raise RuntimeError("boom")
    assert sorted(os.listdir(tmp_path)) == ["keep.ffr"]
    with FileReader(path) as r:
        assert r.read_one(0).tobytes() == b"old"


def test_unfinished_file_is_invisible_until_close(tmp_path):
    path = tmp_path / "f.ffr"
    w = FileWriter(path, 2)
    w.write_one(b"a")
    assert not path.exists()
    w.write_one(b"b")
    w.close()
    w.close()  # twice is fine
    assert path.exists()


def test_write_one_refuses_non_buffers(tmp_path):
    with FileWriter(tmp_path / "f.ffr", 1) as w:
        with pytest.raises(TypeError, match="bytes-like"):
            w.write_one("text")
        w.write_one(b"ok")


# -- corrupt files ------------------------------------------------------------------------


def good_bytes() -> bytes:
    return reference_file([b"first", b"second!", b"third"])


def corruptions() -> dict[str, bytes]:
    good = good_bytes()
    n = 3
    data_start = 12 + 12 * n

    def patch(at: int, raw: bytes, fix_meta: bool = False) -> bytes:
        out = bytearray(good)
        out[at : at + len(raw)] = raw
        if fix_meta:  # keep the header checksum valid, to reach the structural checks
            out[0:4] = struct.pack("<I", zlib.crc32(bytes(out[4:data_start])))
        return bytes(out)

    # kind -> (file bytes, what the error must say)
    return {
        "empty": (b"", "truncated header"),
        "shorter than 12 bytes": (good[:7], "truncated header"),
        "header cut short": (good[: data_start - 1], "declares 3 samples"),
        "negative count": (patch(4, struct.pack("<q", -1)), "declares -1 samples"),
        "count beyond file": (patch(4, struct.pack("<q", 10**9)), "declares 1000000000"),
        "header checksum wrong": (patch(0, b"\x00\x00\x00\x01"), "header checksum mismatch"),
        "header byte flipped": (patch(20, b"\xff"), "header checksum mismatch"),
        "first offset wrong": (patch(24, struct.pack("<q", data_start + 1), True), "first sample offset"),
        "offsets go backwards": (patch(32, struct.pack("<q", data_start + 20), True), "goes backwards"),
        "offset beyond end": (patch(40, struct.pack("<q", 10**6), True), "beyond the file"),
        "data truncated before last sample": (good[: data_start + 6], "beyond the file"),
    }


@pytest.mark.parametrize("kind", sorted(corruptions()))
def test_corrupt_files_are_refused_at_open(tmp_path, kind):
    path = tmp_path / "bad.ffr"
    raw, message = corruptions()[kind]
    path.write_bytes(raw)
    with pytest.raises(FormatError, match="bad.ffr") as info:
        FileReader(path)
    assert message in str(info.value)


@pytest.mark.parametrize("io", ["mmap", "pread"])
def test_corrupt_sample_raises_checksum_error_naming_file_and_sample(tmp_path, io):
    raw = bytearray(good_bytes())
    raw[-8] ^= 0x01  # inside sample 1 ("second!")
    path = tmp_path / "flip.ffr"
    path.write_bytes(bytes(raw))
    with FileReader(path, io=io) as r:
        assert r.read_one(0).tobytes() == b"first"
        with pytest.raises(ChecksumError) as info:
            r.read([2, 1, 0])
        assert info.value.index == 1 and info.value.path == str(path)
        assert "flip.ffr" in str(info.value) and "sample 1" in str(info.value)
        with pytest.raises(ChecksumError):
            r.validate()
    with FileReader(path, check_data=False, io=io) as r:
        assert len(r.read_one(1)) == 7  # unchecked reads return the bytes as they are


def test_truncated_last_sample_fails_its_checksum(tmp_path):
    path = tmp_path / "cut.ffr"
    path.write_bytes(good_bytes()[:-2])
    with FileReader(path) as r:
        with pytest.raises(ChecksumError, match="sample 2"):
            r.read_one(2)


def test_legacy_zero_header_checksum_is_accepted_with_a_warning(tmp_path):
    samples = [b"a", b"bc"]
    path = tmp_path / "legacy.ffr"
    path.write_bytes(reference_file(samples, legacy=True))
    with pytest.warns(LegacyHeaderWarning, match="legacy.ffr"):
        r = FileReader(path)
    with r:
        assert [a.tobytes() for a in r.read([1, 0])] == [b"bc", b"a"]
        assert r.legacy_files == [str(path)]


def test_checksummed_file_gives_no_warning(tmp_path):
    path = write(tmp_path / "ok.ffr", [b"a"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FileReader(path).close()


# -- property test -------------------------------------------------------------------------

samples_strategy = st.lists(st.binary(max_size=300), max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(samples=samples_strategy, data=st.data())
def test_random_sample_sets_round_trip(tmp_path_factory, samples, data):
    path = tmp_path_factory.mktemp("h") / "h.ffr"
    write(path, samples)
    assert path.read_bytes() == reference_file(samples)
    io = data.draw(st.sampled_from(["auto", "mmap", "pread"]))
    with FileReader(path, io=io) as r:
        assert r.n == len(samples)
        if samples:
            idx = data.draw(st.lists(st.integers(0, len(samples) - 1), max_size=50))
            assert [a.tobytes() for a in r.read(idx)] == [samples[i] for i in idx]
        r.validate()
