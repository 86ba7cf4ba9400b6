"""The records a push keeps in ``.hfai``: each read and written as itself, and one that does not
read is named with what is wrong (an error for the marker, a cache missed for the rest)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from hfai.api.workspace import MARKER_DIR, Marker, read_marker, write_marker
from hfai.protocol.errors import InvalidRequest
from hfai.storage.marker import QUICK, SENT, JournalEntry, PushedIndex, RecordError, init, read_known, read_quick


def test_the_marker_is_written_and_read_back_as_itself(tmp_path: Path):
    for marker in (Marker("w"), Marker("w", remote="/ws/alice/w", pushed_ts=12.5)):
        write_marker(tmp_path, marker)
        assert read_marker(tmp_path) == marker
    # Keys it does not know are ignored (no version): a newer client's marker still reads.
    (tmp_path / MARKER_DIR / "workspace.json").write_text(json.dumps({"name": "w", "later": 1}))
    assert read_marker(tmp_path) == Marker("w")


@pytest.mark.parametrize("text", ['{"remote": "/ws/alice/w"}', '{"name": 3}', '["w"]', '{"name": "w", "remote": 1}',
                                  '{"name": "w", "pushed_ts": "yesterday"}', "{not json"])
def test_a_marker_that_is_not_one_is_an_error_saying_what_to_do(tmp_path: Path, text: str):
    (tmp_path / MARKER_DIR).mkdir()
    (tmp_path / MARKER_DIR / "workspace.json").write_text(text)
    with pytest.raises(InvalidRequest, match=r"workspace\.json: .*`hfai workspace init` again"):
        read_marker(tmp_path)


def test_init_keeps_the_push_of_the_same_name_and_forgets_another_names(tmp_path: Path):
    assert init(tmp_path, "w") == Marker("w")
    write_marker(tmp_path, Marker("w", remote="/ws/alice/w", pushed_ts=1.0))
    PushedIndex(8, {"a": [1, 2, ["h"], 3, 0o644]}, "d").write(tmp_path)
    assert init(tmp_path, "w").remote == "/ws/alice/w" and (tmp_path / MARKER_DIR / QUICK).exists()
    assert init(tmp_path, "v") == Marker("v") and not (tmp_path / MARKER_DIR / QUICK).exists()


def test_the_local_index_round_trips_and_one_that_does_not_read_is_a_cache_missed(tmp_path: Path, caplog):
    (tmp_path / MARKER_DIR).mkdir()
    index = PushedIndex(8, {"a": [1, 2, ["h"], 3, 0o644]}, "d")
    index.write(tmp_path)
    assert PushedIndex.read(tmp_path) == index and read_quick(tmp_path, 8) == (index.files, "d")
    assert read_quick(tmp_path, 16) == ({}, "")  # made for other chunks: none
    for text, wrong in (("{", "not JSON"), ('{"chunk_bytes": 8, "files": []}', "files is a list"),
                        ('{"files": {}}', "chunk_bytes is None"),
                        ('{"chunk_bytes": 8, "digest": 1}', "digest is a int")):
        (tmp_path / MARKER_DIR / QUICK).write_text(text)
        with pytest.raises(RecordError, match=f"pushed.json: {wrong}"):
            PushedIndex.read(tmp_path)
        with caplog.at_level(logging.WARNING, logger="hfai.storage.marker"):
            caplog.clear()
            assert read_quick(tmp_path, 8) == ({}, "")
        assert wrong in caplog.text and "hashed again" in caplog.text


def test_a_journal_entry_is_one_line_and_a_line_that_is_not_one_is_skipped(tmp_path: Path):
    entry = JournalEntry("d/a.txt", 5, 123, ("h1",), 77, 0o644)
    assert entry.line().endswith("\n") and "\n" not in entry.line()[:-1]
    assert JournalEntry.parse(entry.line()) == entry
    for bad in ('["a", 1, 2, "h1", 3, 4]', '["a", 1, 2, [], 3]', '{"path": "a"}', '["a", 1, 2, [], 3, 4'):
        with pytest.raises(RecordError, match="sent.jsonl"):
            JournalEntry.parse(bad)
    (tmp_path / MARKER_DIR).mkdir()
    PushedIndex(8, {"b": [1, 2, ["hb"], 3, 0o644]}, "d").write(tmp_path)
    # A cut-short last line (a kill) costs its file only; the journal makes the last digest moot.
    (tmp_path / MARKER_DIR / SENT).write_text(entry.line() + '["c.txt", 2, 1')
    assert read_known(tmp_path, 8) == ({"b": [1, 2, ["hb"], 3, 0o644], "d/a.txt": [5, 123, ["h1"], 77, 0o644]}, "")
