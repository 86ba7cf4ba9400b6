"""A job can make any directory of its workspace a symlink, or any file a hard link, at any moment;
the service (root, in production) must never read, copy, link, stat, remove or send a file outside
that workspace because of it (issue 38 §1). Real files, real symlinks and hard links: bob's job
points his tree at alice's workspace or at a file outside every workspace, then pushes."""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from pathlib import Path

import pytest

from hfai.core.config import Config, StorageConfig
from hfai.protocol import storage as s
from hfai.protocol.errors import Conflict, InvalidRequest
from hfai.storage import commit as commit_mod
from hfai.storage import rules, swap
from hfai.storage.beneath import Tree
from hfai.storage.chunks import chunk_hash
from hfai.storage.workspace import Workspaces

CHUNK = 1024
NAME = "proj"
SECRET = b"alice's private key " * 150  # 3000 bytes: bob's file of the same size stands beside it
BOBS = b"bob's own key bytes " * 150


def _manifest(files: dict[str, tuple[bytes, int]]) -> tuple[s.Manifest, dict[str, bytes]]:
    entries, chunks = [], {}
    for path, (body, mode) in sorted(files.items()):
        parts = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]
        chunks.update({chunk_hash(p): p for p in parts})
        entries.append(s.FileEntry(path=path, size=len(body), mode=mode, chunks=tuple(chunk_hash(p) for p in parts)))
    return s.Manifest(files=tuple(entries), chunk_bytes=CHUNK), chunks


def _commit(ws: Workspaces, user: str, files: dict[str, tuple[bytes, int]], staged: bool = True) -> s.Manifest:
    m, chunks = _manifest(files)
    commit_mod.commit(ws, user, NAME, m, (chunks if staged else {}).__getitem__)
    return m


def _files_with(top: Path, body: bytes) -> list[str]:
    """The regular files under ``top`` (no symlink followed) holding ``body``."""
    out = []
    for dirpath, _dirs, names in os.walk(top):
        for n in names:
            p = Path(dirpath) / n
            if p.is_file() and not p.is_symlink() and p.read_bytes() == body:
                out.append(str(p.relative_to(top)))
    return out


class Cluster:
    """alice's workspace holds keys/id and keys/ssh/id (SECRET); bob's the same paths (BOBS) and
    run.sh. ``point(rel)`` is bob's job replacing his directory ``rel`` by a symlink to alice's."""

    def __init__(self, tmp: Path):
        self.ws = Workspaces(tmp / "root", tmp / "state")
        self.alice = {"keys/id": (SECRET, 0o600), "keys/ssh/id": (SECRET, 0o600)}
        _commit(self.ws, "alice", self.alice)
        self.bob = {"keys/id": (BOBS, 0o600), "keys/ssh/id": (BOBS, 0o600), "run.sh": (b"echo 1\n", 0o644)}
        self.bob_m = _commit(self.ws, "bob", self.bob)

    def point(self, rel: str) -> None:
        mine = self.ws.path("bob", NAME) / rel
        shutil.rmtree(mine)
        mine.symlink_to(self.ws.path("alice", NAME) / rel)

    def bob_push(self, changes: dict[str, tuple[bytes, int] | None], send_all: bool = False) -> None:
        """Commit bob's tree with ``changes`` (None: removed), with what a client would have
        sent staged: the chunks of the files whose bytes changed, none of a mode change's
        (``send_all``: every chunk, as after a Conflict)."""
        files = {k: v for k, v in {**self.bob, **changes}.items() if v is not None}
        m, chunks = _manifest(files)
        _m, sent = _manifest({k: v for k, v in changes.items() if v is not None and v[0] != self.bob.get(k, (b"",))[0]})
        commit_mod.commit(self.ws, "bob", NAME, m, (chunks if send_all else {h: chunks[h] for h in sent}).__getitem__)

    def leaked(self) -> list[str]:
        return _files_with(self.ws.root / "bob", SECRET)

    def alice_intact(self) -> bool:
        base = self.ws.path("alice", NAME)
        return all((base / rel).read_bytes() == body for rel, (body, _m) in self.alice.items())


# ---------------------------------------------------------------------------- the commit

def test_a_mode_change_under_a_directory_made_a_symlink_copies_nothing_of_alice_s(tmp_path):
    """The issue's case: keys/ points at alice's keys/, the push changes only keys/id's mode."""
    c = Cluster(tmp_path)
    c.point("keys")
    with pytest.raises(Conflict):
        c.bob_push({"keys/id": (BOBS, 0o644)})
    assert c.leaked() == [] and c.alice_intact()


def test_a_symlinked_grandparent_is_not_followed_either(tmp_path):
    c = Cluster(tmp_path)
    c.point("keys")
    with pytest.raises(Conflict):
        c.bob_push({"keys/ssh/id": (BOBS, 0o644)})
    assert c.leaked() == [] and c.alice_intact()


def test_an_unchanged_file_under_a_symlink_is_not_linked_from_alice_s_tree(tmp_path, monkeypatch):
    """Only run.sh changes: keys/id is an unchanged file, hard-linked from the old tree into the
    new one, which is what bob's path shows once swapped in."""
    c = Cluster(tmp_path)
    alice_ino = (c.ws.path("alice", NAME) / "keys/id").stat().st_ino
    c.point("keys")
    swapped_in: list[set[int]] = []
    real = swap.exchange

    def look(a, b):
        done = real(a, b)
        swapped_in.append({os.lstat(Path(d) / n).st_ino for d, _s, ns in os.walk(a) for n in ns})
        return done

    monkeypatch.setattr(swap, "exchange", look)
    try:
        c.bob_push({"run.sh": (b"echo 2\n", 0o644)})
    except Conflict:
        pass  # refusing is fine; taking alice's inode is not
    assert not any(alice_ino in seen for seen in swapped_in)
    assert c.leaked() == [] and c.alice_intact()


def test_a_symlink_swapped_in_between_the_check_and_the_copy_is_not_followed(tmp_path, monkeypatch):
    """The plan sees bob's real keys/ (sizes and all); the job swaps the symlink in right after."""
    c = Cluster(tmp_path)
    real = rules.commit_plan

    def then_swap(*a, **kw):
        out = real(*a, **kw)
        c.point("keys")
        return out

    monkeypatch.setattr(rules, "commit_plan", then_swap)
    with pytest.raises(Conflict):
        c.bob_push({"keys/id": (BOBS, 0o644)})
    assert c.leaked() == [] and c.alice_intact()


def test_a_hard_link_to_a_file_outside_is_not_copied(tmp_path):
    """Bob's job makes keys/id a hard link to a file of the right size outside every workspace:
    the service copies a file's bytes only after checking them against bob's own chunk hashes."""
    c = Cluster(tmp_path)
    outside = tmp_path / "outside" / "secret"
    outside.parent.mkdir()
    outside.write_bytes(SECRET)
    mine = c.ws.path("bob", NAME) / "keys/id"
    mine.unlink()
    os.link(outside, mine)
    with pytest.raises(Conflict, match="keys/id"):
        c.bob_push({"keys/id": (BOBS, 0o644)})
    copies = [p for p in c.leaked() if (c.ws.root / "bob" / p).stat().st_ino != outside.stat().st_ino]
    assert copies == []


def test_a_file_removed_by_the_push_is_not_unlinked_through_a_symlink(tmp_path):
    """The push drops keys/id: the old tree's keys/ is by now a symlink to alice's keys/."""
    c = Cluster(tmp_path)
    c.point("keys")
    c.bob_push({"keys/id": None, "run.sh": (b"echo 2\n", 0o644)}, send_all=True)
    assert c.alice_intact()


# ------------------------------------------------------------------------------- a pull

def _fetch(ws: Workspaces, tmp: Path, hashes: tuple[str, ...]) -> s.Chunks:
    from hfai.storage.service import StorageService

    sc = StorageConfig(workspace_root=str(ws.root), state_dir=str(ws.manifests.parent), chunk_bytes=CHUNK)
    svc = StorageService(Config(storage=sc))
    return asyncio.run(svc.ws_fetch("bob", False, s.FetchRequest(workspace=NAME, hashes=hashes)))


def test_a_pull_does_not_read_through_a_symlinked_directory(tmp_path):
    c = Cluster(tmp_path)
    c.point("keys")
    wanted = next(f for f in c.bob_m.files if f.path == "keys/id").chunks
    try:
        got = _fetch(c.ws, tmp_path, wanted)
    except InvalidRequest:
        return
    assert all(SECRET[:CHUNK] not in ch.data for ch in got.chunks)


def test_a_pull_does_not_send_a_hard_linked_file_s_bytes(tmp_path):
    c = Cluster(tmp_path)
    outside = tmp_path / "outside"
    outside.write_bytes(SECRET)
    mine = c.ws.path("bob", NAME) / "keys/id"
    mine.unlink()
    os.link(outside, mine)
    wanted = next(f for f in c.bob_m.files if f.path == "keys/id").chunks
    with pytest.raises(InvalidRequest, match="list it again"):
        _fetch(c.ws, tmp_path, wanted)


# ------------------------------------------------------------------------------ the walk

def test_the_walk_refuses_a_symlink_or_a_file_on_the_way(tmp_path):
    (tmp_path / "t/a/b").mkdir(parents=True)
    (tmp_path / "t/a/b/f").write_bytes(b"x")
    (tmp_path / "elsewhere/b").mkdir(parents=True)
    (tmp_path / "elsewhere/b/f").write_bytes(b"y")
    (tmp_path / "t/link").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "t/file").write_bytes(b"z")
    with Tree.of(tmp_path / "t") as t:
        assert t.lstat("a/b/f").st_size == 1
        link = (errno.ELOOP, errno.ENOTDIR)  # Linux says ENOTDIR for a symlink opened as a directory
        for rel, codes in (("link/b/f", link), ("a/../link/b/f", (errno.EINVAL,)), ("file/f", (errno.ENOTDIR,)),
                           ("/etc/passwd", (errno.EINVAL,)), ("a//b/f", (errno.EINVAL,))):
            with pytest.raises(OSError) as e:
                t.lstat(rel)
            assert e.value.errno in codes, rel
        with pytest.raises(OSError) as e:
            t.open("link", os.O_RDONLY)  # the last component is not followed either
        assert e.value.errno == errno.ELOOP
    with pytest.raises(OSError):
        Tree.of(tmp_path / "t/link")


def test_a_directory_once_open_stays_itself_and_forget_finds_what_is_there_now(tmp_path):
    (tmp_path / "t/a").mkdir(parents=True)
    (tmp_path / "t/a/f").write_bytes(b"mine")
    (tmp_path / "other").mkdir()
    (tmp_path / "other/f").write_bytes(b"theirs")
    with Tree.of(tmp_path / "t") as t:
        fd = t.dir("a")
        os.rename(tmp_path / "t/a", tmp_path / "t/moved")
        (tmp_path / "t/a").symlink_to(tmp_path / "other")
        assert os.lstat("f", dir_fd=fd).st_size == 4  # still bob's own directory
        t.forget("a")
        with pytest.raises(OSError):
            t.lstat("a/f")


def test_a_tree_keeps_a_bounded_number_of_descriptors_and_closes_them(tmp_path):
    for i in range(20):
        (tmp_path / f"t/d{i}/e").mkdir(parents=True)
    before = len(os.listdir("/proc/self/fd"))
    t = Tree.of(tmp_path / "t", keep=4)
    for i in range(20):
        t.lstat(f"d{i}/e")
        assert len(os.listdir("/proc/self/fd")) <= before + 1 + 4
    t.close()
    t.close()
    assert len(os.listdir("/proc/self/fd")) == before


# ----------------------------------------------------------------------------------- GC

def test_gc_does_not_move_a_file_through_a_symlink_swapped_in_after_its_scan(tmp_path, monkeypatch):
    """GC found bob's a/b/old.bin untouched for long; the job then makes a/ a symlink to alice's
    a/, which has a b/old.bin too. The move must not take alice's file into bob's GC area."""
    from hfai.storage import gc

    ws = Workspaces(tmp_path / "root", tmp_path / "state")
    now, old = 1_000_000_000.0, 1_000_000_000.0 - 30 * 86400
    for user, body, t in (("alice", SECRET, now), ("bob", BOBS, old)):  # alice's is in use: GC keeps it
        f = ws.path(user, NAME) / "a/b/old.bin"
        f.parent.mkdir(parents=True)
        f.write_bytes(body)
        os.utime(f, (t, t))
    real = rules.gc_moves

    def then_swap(*a, **kw):
        out = real(*a, **kw)
        if out:
            mine = ws.path("bob", NAME) / "a"
            shutil.rmtree(mine)
            mine.symlink_to(ws.path("alice", NAME) / "a")
        return out

    monkeypatch.setattr(rules, "gc_moves", then_swap)
    gc.run_gc(ws, tmp_path / "gc", now, 7 * 86400, 7 * 86400)
    assert (ws.path("alice", NAME) / "a/b/old.bin").read_bytes() == SECRET
    assert _files_with(tmp_path / "gc" / "bob", SECRET) == []


def test_gc_to_another_filesystem_copies_through_descriptors_and_keeps_links_as_links(tmp_path, monkeypatch):
    from hfai.storage import gc

    ws = Workspaces(tmp_path / "root", tmp_path / "state")
    now, old = 1_000_000_000.0, 1_000_000_000.0 - 30 * 86400
    base = ws.path("bob", NAME)
    (base / "a/b/deep").mkdir(parents=True)
    (base / "a/b/deep/y.txt").write_bytes(BOBS)
    (base / "a/b/deep/out").symlink_to(ws.path("alice", NAME))
    for p in (base / "a/b/deep/y.txt", base / "a/b/deep/out", base / "a/b/deep"):
        os.utime(p, (old, old), follow_symlinks=False)
    real = os.rename

    def other_filesystem(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        if src_dir_fd is not None:
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        return real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "rename", other_filesystem)
    result = gc.run_gc(ws, tmp_path / "gc", now, 7 * 86400, 7 * 86400)
    moved = tmp_path / "gc" / "bob" / str(int(now)) / NAME / "a/b/deep"
    assert result.moved == (f"bob/{NAME}/a/b/deep",) and not (base / "a/b/deep").exists()
    assert (moved / "y.txt").read_bytes() == BOBS and (moved / "y.txt").stat().st_mtime == old
    assert (moved / "out").is_symlink()
