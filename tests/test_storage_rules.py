"""The storage service's pure decisions (table-driven), .hfignore, chunking, and GC on real files
with injected times (never slept)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hfai.protocol import decode, encode
from hfai.protocol.errors import InvalidRequest
from hfai.protocol.storage import ChunkData, FileEntry, Manifest, PutRequest
from hfai.protocol.types import RestrictedUsers
from hfai.storage import rules
from hfai.storage.chunks import build_manifest, chunk_hash
from hfai.storage.gc import run_gc
from hfai.storage.ignore import Ignore
from hfai.storage.staging import describe, parse_description
from hfai.storage.transport import packs
from hfai.storage.workspace import Workspaces

DAY = 86400.0


def fe(path, size, chunks, mode=0o644):
    return FileEntry(path=path, size=size, mode=mode, chunks=tuple(chunks))


@pytest.mark.parametrize("manifest, ok", [
    (Manifest(files=(fe("a", 3, "h"),), chunk_bytes=4), True),
    (Manifest(files=(fe("a", 5, "hh"),), chunk_bytes=4), True),
    (Manifest(files=(fe("a", 0, ""),), chunk_bytes=4), True),
    (Manifest(files=(fe("a", 5, "h"),), chunk_bytes=4), False),          # too few chunks
    (Manifest(files=(fe("../x", 1, "h"),), chunk_bytes=4), False),       # leaves the workspace
    (Manifest(files=(fe("/etc/x", 1, "h"),), chunk_bytes=4), False),
    (Manifest(files=(fe("a//b", 1, "h"),), chunk_bytes=4), False),
    (Manifest(files=(fe("a", 1, "h"), fe("a", 1, "h")), chunk_bytes=4), False),
    (Manifest(files=(fe("a", 1, "h"), fe("a/b", 1, "h")), chunk_bytes=4), False),  # file and dir
])
def test_check_manifest(manifest, ok):
    if ok:
        rules.check_manifest(manifest, 4)
    else:
        with pytest.raises(InvalidRequest):
            rules.check_manifest(manifest, 4)


@pytest.mark.parametrize("name, ok", [("proj", True), ("a.b-c_1", True), ("..", False), (".hidden", False),
                                      ("a/b", False), ("", False), ("x" * 65, False)])
def test_workspace_names(name, ok):
    if ok:
        assert rules.check_workspace_name(name) == name
    else:
        with pytest.raises(InvalidRequest):
            rules.check_workspace_name(name)


def test_missing_keeps_order_and_drops_repeats():
    assert rules.missing(["a", "b", "a", "c", "d"], {"b"}) == ("a", "c", "d")


OLD = Manifest(files=(fe("same", 4, "x"), fe("changed", 8, "ab"), fe("gone", 1, "g"), fe("mode", 1, "m")),
               chunk_bytes=4)
NEW = Manifest(files=(fe("same", 4, "x"), fe("changed", 8, "aB"), fe("mode", 1, "m", 0o755), fe("new", 1, "n")),
               chunk_bytes=4)


@pytest.mark.parametrize("present, write", [
    ({"same": 4, "changed": 8, "gone": 1, "mode": 1}, ["changed", "new"]),
    ({"changed": 8, "gone": 1, "mode": 1}, ["same", "changed", "new"]),       # vanished (GC): written again
    ({"same": 3, "changed": 8, "gone": 1, "mode": 1}, ["same", "changed", "new"]),  # size changed
])
def test_commit_plan(present, write):
    p = rules.commit_plan(OLD, NEW, present)
    assert [f.path for f in p.write] == write
    assert [f.path for f in p.chmod] == ["mode"]
    assert p.delete == ("gone",)


def test_held_chunks_only_from_files_still_present():
    held = rules.held_chunks(OLD, {"changed": 8, "same": 3})
    assert held == {"a": ("changed", 0), "b": ("changed", 4)}


R = "storage: over"


@pytest.mark.parametrize("current, over, expect", [
    ({}, {}, None),
    ({}, {"bob": R}, {"bob": R}),
    ({"bob": R}, {"bob": R + " again"}, None),             # already restricted: unchanged
    ({"ann": "other rule"}, {"bob": R}, {"ann": "other rule", "bob": R}),
    ({"bob": R}, {}, None),                                # a scan never lifts
])
def test_restrict(current, over, expect):
    got = rules.restrict(RestrictedUsers(users=current), over)
    assert (got.users if got else None) == expect


@pytest.mark.parametrize("current, used, limit, expect", [
    ({"bob": R}, 10, 100, {}),
    ({"bob": R}, 101, 100, None),                          # still over: stays
    ({"bob": "quota rule"}, 10, 100, None),                # not ours to lift
    ({}, 10, 100, None),
    ({"bob": R, "ann": R}, 100, 100, {"ann": R}),
])
def test_lift(current, used, limit, expect):
    got = rules.lift(RestrictedUsers(users=current), "bob", used, limit)
    assert (got.users if got else None) == expect


def test_over_limit_reason_is_storage_tagged():
    got = rules.over_limit({"a": 5, "b": 11}, 10)
    assert list(got) == ["b"] and got["b"].startswith(rules.STORAGE_REASON)


NOW = 1_000 * DAY


@pytest.mark.parametrize("entries, moved", [
    ([rules.Entry("old", False, 1, NOW - 8 * DAY), rules.Entry("new", False, 1, NOW - DAY)], ["old"]),
    ([rules.Entry("a/b/old", False, 3, NOW - 8 * DAY)], ["a/b/old"]),
    ([rules.Entry("a/b/dir", True, 3, NOW - 8 * DAY)], ["a/b/dir"]),          # level 3 dir: whole
    ([rules.Entry("a/b/dir", True, 3, NOW - DAY)], []),                       # something in it is new
    ([rules.Entry("a/dir", True, 2, NOW - 8 * DAY)], []),                     # upper dirs are walked
    ([rules.Entry("x", False, 1, NOW - 7 * DAY)], []),                        # exactly the age: kept
])
def test_gc_moves(entries, moved):
    assert rules.gc_moves(entries, NOW, 7 * DAY) == moved


def test_gc_expired():
    assert rules.gc_expired([str(int(NOW - 8 * DAY)), str(int(NOW - DAY)), "junk"], NOW, 7 * DAY) == \
        [str(int(NOW - 8 * DAY))]


def test_packs_bound_each_request():
    sizes = {"a": 5, "b": 5, "c": 9, "d": 1}
    assert packs(["a", "b", "c", "d"], sizes, 10) == [["a", "b"], ["c", "d"]]
    assert packs(["c", "c2"], {"c": 9, "c2": 9}, 10) == [["c"], ["c2"]]


def test_pack_description_round_trip():
    assert parse_description(describe([("h1", 3), ("h2", 0)])) == [("h1", 3), ("h2", 0)]
    assert parse_description("garbage,,x:y") == []


def test_storage_messages_round_trip():
    req = PutRequest(workspace="w", chunks=(ChunkData(hash="h", data=b"\0\1"),))
    assert decode(encode(req), PutRequest) == req


def test_hfignore_and_manifest(tmp_path: Path):
    (tmp_path / ".hfignore").write_text("*.log\ndata/\n!keep.log\n")
    for rel, body in [("a.py", b"x"), ("run.log", b"l"), ("keep.log", b"k"), ("data/big", b"d"),
                      ("src/m.py", b"y" * 10), (".hfai/workspace.json", b"{}"), (".git/HEAD", b"h")]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(body)
    m = build_manifest(tmp_path, 4)
    assert sorted(f.path for f in m.files) == [".hfignore", "a.py", "keep.log", "src/m.py"]
    src = next(f for f in m.files if f.path == "src/m.py")
    assert src.size == 10 and src.chunks == (chunk_hash(b"yyyy"), chunk_hash(b"yyyy"), chunk_hash(b"yy"))
    assert Ignore(["*.tmp"]).ignored("a/b.tmp") and not Ignore(["*.tmp"]).ignored("a/b.py")


def test_gc_moves_and_deletes_by_date(tmp_path: Path):
    ws = Workspaces(tmp_path / "ws", tmp_path / "state")
    root = ws.root / "alice" / "proj"
    files = {"old.txt": NOW - 8 * DAY, "new.txt": NOW - DAY, "a/b/old.bin": NOW - 9 * DAY,
             "a/b/deep/x/y.txt": NOW - 10 * DAY, "a/b/mixed/old": NOW - 10 * DAY, "a/b/mixed/sub/new": NOW - DAY}
    for rel, t in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
        os.utime(root / rel, (t, t))
    for d in ("a/b/deep", "a/b/deep/x", "a/b/mixed", "a/b/mixed/sub"):
        os.utime(root / d, (NOW - 10 * DAY, NOW - 10 * DAY))
    ws.save_manifest("alice", "proj", Manifest(files=tuple(fe(r, len(r), "h" * ((len(r) + 3) // 4))
                                                            for r in files), chunk_bytes=4))
    result = run_gc(ws, tmp_path / "gc", NOW, 7 * DAY, 7 * DAY)
    assert sorted(result.moved) == ["alice/proj/a/b/deep", "alice/proj/a/b/old.bin", "alice/proj/old.txt"]
    stamp = tmp_path / "gc" / "alice" / str(int(NOW)) / "proj"
    assert (stamp / "old.txt").read_text() == "old.txt" and (stamp / "a/b/deep/x/y.txt").exists()
    assert (root / "new.txt").exists() and (root / "a/b/mixed/old").exists() and not (root / "old.txt").exists()
    left = {f.path for f in ws.manifest("alice", "proj").files}
    assert left == {"new.txt", "a/b/mixed/old", "a/b/mixed/sub/new"}
    # 8 days later the gc entry is deleted; the files still young in the workspace are moved now.
    later = run_gc(ws, tmp_path / "gc", NOW + 8 * DAY, 7 * DAY, 7 * DAY)
    assert later.deleted == (f"alice/{int(NOW)}",) and not stamp.exists()
    assert "alice/proj/new.txt" in later.moved


@pytest.mark.parametrize("group", ["workspace", "dataset", "env"])
def test_storage_commands_help_imports_neither_torch_nor_nats(group):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "hfai.cli.main", group, "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Usage" in r.stdout
    imported = {line.rsplit("|", 1)[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert "torch" not in imported and "nats" not in imported


def test_quick_check_reuses_hashes_of_unchanged_files_only(tmp_path: Path):
    from hfai.storage.chunks import quick_index

    (tmp_path / "a").write_bytes(b"aaaa")
    (tmp_path / "b").write_bytes(b"bbbb")
    stamps: dict = {}
    first = build_manifest(tmp_path, 4, stamps=stamps)
    known = quick_index(tmp_path, first, stamps)
    known["a"][2] = ["stale-but-trusted"]  # unchanged size and mtime: not read again
    (tmp_path / "b").write_bytes(b"BBBB")
    os.utime(tmp_path / "b", ns=(stamps["b"] + 10**9, stamps["b"] + 10**9))
    again = {f.path: f.chunks for f in build_manifest(tmp_path, 4, known=known).files}
    assert again["a"] == ("stale-but-trusted",) and again["b"] == (chunk_hash(b"BBBB"),)
