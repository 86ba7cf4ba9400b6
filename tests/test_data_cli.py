"""`hfai data` commands, through click's runner: results, and one-line errors for user mistakes."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from hfai.cli.data import data_group
from hfai.data import FileWriter, MultiFileWriter


def run(*args: str):
    return CliRunner().invoke(data_group, list(args))


def assert_clean_error(result, fragment: str) -> None:
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    # stderr may also hold a progress label; the error itself is exactly one line
    errors = [line for line in result.output.splitlines() if "Error" in line or "error" in line]
    assert len(errors) == 1 and errors[0].startswith("Error:") and fragment in errors[0], result.output


@pytest.fixture
def ffr(tmp_path) -> str:
    path = tmp_path / "d.ffr"
    with FileWriter(path, 4) as w:
        for s in (b"zero", b"one", b"", b"three"):
            w.write_one(s)
    return str(path)


def test_pack_then_info_verify_cat(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_bytes(b"alpha")
    (src / "sub" / "b.txt").write_bytes(b"beta")
    out = tmp_path / "packed.ffr"
    result = run("pack", str(src), str(out))
    assert result.exit_code == 0 and "2 files packed" in result.output
    info = run("info", str(out))
    assert info.exit_code == 0 and "samples:       3" in info.output and "packed folder: yes (2 files)" in info.output
    assert run("verify", str(out)).exit_code == 0
    assert run("cat", str(out), "sub/b.txt").stdout_bytes == b"beta"
    assert run("cat", str(out), "0").stdout_bytes == b"alpha"


def test_info_on_a_directory(tmp_path):
    with MultiFileWriter(tmp_path / "parts", 5, 2) as w:
        for i in range(5):
            w.write_one(bytes(i))
    result = run("info", str(tmp_path / "parts"))
    assert result.exit_code == 0
    assert "ffr files:     2" in result.output and "sample bytes:  min 0, mean 2.0, max 4" in result.output


def test_verify_reports_the_first_bad_sample(ffr):
    raw = bytearray(open(ffr, "rb").read())
    raw[-1] ^= 0xFF  # last byte of sample 3
    raw[-7] ^= 0xFF  # inside sample 1 ("one" ends where the 5 bytes of "three" start)
    open(ffr, "wb").write(bytes(raw))
    assert_clean_error(run("verify", ffr), "sample 1")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("info", "/nonexistent/x.ffr"), "no such file"),
        (("cat", "{ffr}", "9"), "out of range"),
        (("cat", "{ffr}", "--", "-1"), "negative"),
        (("cat", "{ffr}", "some/path"), "not a packed folder"),
        (("verify", "{trunc}"), "truncated"),
    ],
)
def test_user_mistakes_are_one_line_errors(ffr, tmp_path, args, fragment):
    trunc = tmp_path / "t.ffr"
    trunc.write_bytes(open(ffr, "rb").read()[:20])
    assert_clean_error(run(*(a.format(ffr=ffr, trunc=trunc) for a in args)), fragment)


def test_cat_writes_raw_bytes(ffr):
    result = run("cat", ffr, "3")
    assert result.exit_code == 0 and result.stdout_bytes == b"three"


def test_group_is_exposed_as_data_for_the_main_cli():
    import click

    from hfai.cli import data as module

    assert isinstance(module.data, click.Group) and module.data.name == "data"
    assert sorted(module.data.commands) == ["cat", "convert", "info", "pack", "verify"]
