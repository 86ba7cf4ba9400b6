"""A workspace commit is all or nothing as a reader sees it, and a commit killed at any step is
finished or undone when the service starts again (issue 26 §3). Real files; the kills are real
SIGKILLs of a forked process, at every filesystem step of the commit in turn."""

from __future__ import annotations

import os
import random
import signal
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from hfai.protocol.errors import Conflict
from hfai.protocol.storage import Manifest
from hfai.storage import commit as commit_mod
from hfai.storage import swap
from hfai.storage.chunks import build_manifest, chunk_hash, file_chunks
from hfai.storage.workspace import Workspaces

CHUNK = 1024
USER, NAME = "alice", "proj"
OUTPUT = ("out/log.txt", b"written by a job\n")  # no manifest lists it: it must survive every commit


def _write_tree(root: Path, files: dict[str, tuple[bytes, int]]) -> None:
    for rel, (data, mode) in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        os.chmod(root / rel, mode)


def _trees() -> dict[str, tuple[dict, dict]]:
    """v1 and v2 (path -> (bytes, mode)) of each case: 'moved' moves content between files (every
    chunk of v2 is somewhere in v1), 'new' brings new chunks, a deleted file, a mode change and a
    file replaced by a directory."""
    rnd = random.Random(26)
    blobs = [rnd.randbytes(3000) for _ in range(5)]
    v1 = {f"d/f{i:05d}": (b, 0o644) for i, b in enumerate(blobs)}
    v1.update({"c": (b"c is a file\n", 0o644), "run.sh": (b"#!/bin/sh\n", 0o644), "top/a/b.py": (b"x = 1\n", 0o644)})
    moved = {f"d/f{i:05d}": (blobs[(i + 1) % 4], 0o644) for i in range(4)}  # f00004 removed
    moved["d/g"] = (blobs[0], 0o644)
    moved.update({k: v1[k] for k in ("c", "run.sh", "top/a/b.py")})
    new = dict(v1)
    del new["c"], new["d/f00003"]
    new.update({"c/x": (b"c is a directory now\n", 0o644), "run.sh": (b"#!/bin/sh\n", 0o755),
                "d/f00001": (rnd.randbytes(2500), 0o644), "d/new": (rnd.randbytes(5000), 0o600)})
    return {"moved": (v1, moved), "new": (v1, new)}


class Setup:
    def __init__(self, tmp: Path, case: str):
        self.tmp = tmp
        v1, v2 = _trees()[case]
        self.views = {"v1": {**v1, OUTPUT[0]: (OUTPUT[1], 0o644)}, "v2": {**v2, OUTPUT[0]: (OUTPUT[1], 0o644)}}
        self.m1, c1 = self._local("local-v1", v1)
        self.m2, c2 = self._local("local-v2", v2)
        # What a push would have staged: v2's chunks the cluster's v1 files lack (none when moved).
        self.staged2 = {h: d for h, d in c2.items() if h not in c1}
        self.case = case

    def _local(self, name: str, files: dict) -> tuple[Manifest, dict[str, bytes]]:
        d = self.tmp / name
        _write_tree(d, files)
        chunks = {chunk_hash(c): c for rel in files for c in file_chunks(d / rel, CHUNK)}
        return build_manifest(d, CHUNK), chunks

    def fresh(self, tag: str) -> Workspaces:
        """A service state with v1 committed and a job's output written into the workspace."""
        ws = Workspaces(self.tmp / tag / "ws", self.tmp / tag / "state")
        c1 = {chunk_hash(c): c for f in self.m1.files for c in file_chunks(self.tmp / "local-v1" / f.path, CHUNK)}
        commit_mod.commit(ws, USER, NAME, self.m1, c1.__getitem__)
        out = ws.path(USER, NAME) / OUTPUT[0]
        out.parent.mkdir()
        out.write_bytes(OUTPUT[1])
        return ws

    def commit_v2(self, ws: Workspaces) -> None:
        commit_mod.commit(ws, USER, NAME, self.m2, self.staged2.__getitem__)

    def seen(self, ws: Workspaces) -> str:
        """What a reader resolving the workspace's path sees: 'v1', 'v2', or the odd tree itself."""
        got = view(ws.path(USER, NAME))
        for tag, want in self.views.items():
            if got == want:
                return tag
        return f"neither v1 nor v2: {sorted(got)}"


def view(base: Path) -> dict[str, tuple[bytes, int]]:
    out = {}
    for dirpath, _dirs, files in os.walk(base):
        for fn in files:
            p = Path(dirpath) / fn
            out[str(p.relative_to(base))] = (p.read_bytes(), stat.S_IMODE(p.lstat().st_mode))
    return out


# Every call that changes the filesystem during a commit goes through one of these.
STEPS = [(os, "replace"), (os, "rename"), (os, "unlink"), (os, "link"), (os, "rmdir"), (os, "mkdir"),
         (swap, "exchange")]


def _before_every_step(monkeypatch, hook: Callable[[], None]) -> None:
    for mod, attr in STEPS:
        real = getattr(mod, attr)

        def wrapped(*a, _real=real, **kw):
            hook()
            return _real(*a, **kw)

        monkeypatch.setattr(mod, attr, wrapped)


def _leftovers(ws: Workspaces) -> list[str]:
    user_dir = ws.root / USER
    found = [p.name for p in user_dir.iterdir() if p.name.startswith(".")]
    found += [str(p) for p in user_dir.rglob(f"*{commit_mod.TMP_SUFFIX}")]
    found += [str(p) for p in ws.manifests.rglob("*") if p.is_file() and not p.name.endswith(".manifest")]
    return found


@pytest.mark.parametrize("case", ["moved", "new"])
def test_a_reader_sees_exactly_v1_or_v2_at_every_step_of_a_commit(tmp_path, monkeypatch, case):
    setup = Setup(tmp_path, case)
    ws = setup.fresh("w")
    seen: list[str] = []
    _before_every_step(monkeypatch, lambda: seen.append(setup.seen(ws)))
    setup.commit_v2(ws)
    monkeypatch.undo()
    assert seen and all(s in ("v1", "v2") for s in seen), [s for s in seen if s not in ("v1", "v2")][:1]
    assert "v2" in seen  # the new tree was visible before the commit finished (it swapped in)
    assert "v1" not in seen[seen.index("v2"):]  # and never the old one after it
    assert setup.seen(ws) == "v2" and not _leftovers(ws)
    assert ws.manifest(USER, NAME) == setup.m2


def _count_steps(setup: Setup, monkeypatch) -> int:
    ws = setup.fresh("count")
    n = [0]
    _before_every_step(monkeypatch, lambda: n.__setitem__(0, n[0] + 1))
    setup.commit_v2(ws)
    monkeypatch.undo()
    return n[0]


def _killed_at(setup: Setup, ws: Workspaces, step: int) -> int:
    """Commit v2 in a forked child that SIGKILLs itself just before its ``step``-th filesystem
    change; returns the child's wait status."""
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery from here on
        try:
            n = [0]

            def maybe_die() -> None:
                if n[0] == step:
                    os.kill(os.getpid(), signal.SIGKILL)
                n[0] += 1

            for mod, attr in STEPS:
                real = getattr(mod, attr)
                setattr(mod, attr, lambda *a, _real=real, **kw: (maybe_die(), _real(*a, **kw))[1])
            setup.commit_v2(ws)
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


@pytest.mark.slow  # ~70 kills, each a fork, a recovery and a retried commit (fsyncs): 5-15 s
@pytest.mark.parametrize("case", ["moved", "new"])
def test_a_commit_killed_at_any_step_leaves_v1_or_v2_and_recovers(tmp_path, monkeypatch, case):
    """Killed before each of the commit's filesystem steps in turn: the reader sees v1 or v2;
    the restarted service finishes or undoes it, leaving no temporary file, tree or journal, a
    manifest that matches the files, and a retried push succeeds (content only moved included:
    it used to fail for good with 'changed on the cluster since it was pushed')."""
    setup = Setup(tmp_path, case)
    total = _count_steps(setup, monkeypatch)
    assert total > 30
    outcomes = set()
    for step in range(total):
        ws = setup.fresh(f"k{step}")
        status = _killed_at(setup, ws, step)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (step, status)
        assert setup.seen(ws) in ("v1", "v2"), (step, setup.seen(ws))
        restarted = Workspaces(ws.root, ws.manifests.parent)
        done = restarted.recover()
        assert [d[:2] for d in done] == ([(USER, NAME)] if done else [])
        after = setup.seen(restarted)
        assert after in ("v1", "v2"), (step, after)
        outcomes.add(after)
        assert not _leftovers(restarted), (step, _leftovers(restarted))
        assert restarted.manifest(USER, NAME) == (setup.m2 if after == "v2" else setup.m1), step
        setup.commit_v2(restarted)  # the retried push
        assert setup.seen(restarted) == "v2", step
    assert outcomes == {"v1", "v2"}  # killed early it is undone, late it is finished


def test_a_file_changed_on_the_cluster_is_forgotten_so_the_next_push_heals(tmp_path):
    """A job rewrote a workspace file in place (same size): a commit that needs its old chunks
    fails once, naming it, and forgets it, so the next push sends it and succeeds."""
    setup = Setup(tmp_path, "moved")
    ws = setup.fresh("w")
    victim = ws.path(USER, NAME) / "d/f00001"
    victim.write_bytes(bytes(3000))
    with pytest.raises(Conflict, match="d/f00001"):
        setup.commit_v2(ws)
    assert setup.seen(ws).startswith("neither") and not _leftovers(ws)  # untouched: v1 with the job's edit
    held = ws.held(USER, NAME)
    lost = [h for f in setup.m1.files if f.path == "d/f00001" for h in f.chunks]
    assert lost and not any(h in held for h in lost)  # ws_missing now asks for them
    local = {chunk_hash(c): c for f in setup.m2.files for c in file_chunks(tmp_path / "local-v2" / f.path, CHUNK)}
    resend = {h: local[h] for h in lost}
    commit_mod.commit(ws, USER, NAME, setup.m2, resend.__getitem__)
    assert setup.seen(ws) == "v2"


def test_recovery_removes_a_tree_nobody_journaled_and_old_temporaries(tmp_path):
    ws = Setup(tmp_path, "new").fresh("w")
    side = commit_mod.next_path(ws.path(USER, NAME))
    side.mkdir()
    (side / "half").write_bytes(b"x")
    stray = ws.path(USER, NAME) / "d" / f".f00002{commit_mod.TMP_SUFFIX}"
    stray.write_bytes(b"left by a killed commit")
    ws.recover()
    assert not side.exists()
    # A temporary without a journal goes at the next commit of that workspace.
    Setup(tmp_path / "again", "new").commit_v2(ws)
    assert not stray.exists()


def test_the_records_a_commit_writes_are_encode_s_bytes_and_the_next_read_decodes_nothing(tmp_path, monkeypatch):
    """The manifest is packed once per commit: the journal and the record must still be exactly
    encode()'s bytes (ws_current compares the record's SHA-256 with the client's encode), and
    manifest() afterwards answers from what was written without decoding it again."""
    from hfai.protocol import decode, encode
    from hfai.storage import rules, workspace

    setup = Setup(tmp_path, "new")
    ws = setup.fresh("w")
    journals: list[bytes] = []
    real = workspace.write_atomic
    monkeypatch.setattr(workspace, "write_atomic",
                        lambda p, data, **kw: (journals.append(data) if str(p).endswith(".journal") else None,
                                               real(p, data, **kw))[1])
    setup.commit_v2(ws)
    monkeypatch.setattr(workspace, "decode", lambda *a: pytest.fail("decoded the manifest just written"))
    assert ws.manifest(USER, NAME) == setup.m2
    monkeypatch.undo()
    record = ws._manifest_path(USER, NAME).read_bytes()
    assert record == encode(setup.m2) and rules.digest_bytes(record) == rules.manifest_digest(setup.m2)
    assert journals and all(j == encode(commit_mod.CommitJournal(
        workspace=NAME, manifest=setup.m2, delete=jj.delete, old_ino=jj.old_ino, new_ino=jj.new_ino,
        phase=jj.phase)) for j, jj in ((j, decode(j, commit_mod.CommitJournal)) for j in journals))


def test_a_commit_relinks_in_the_old_tree_only_the_files_it_wrote(tmp_path, monkeypatch):
    """Every file N shares with D is D's inode already: the apply step touches only the files
    written or copied into N (and deletions), and every file of D ends as N's."""
    setup = Setup(tmp_path, "new")
    ws = setup.fresh("w")
    before = {f.path: (ws.path(USER, NAME) / f.path).stat().st_ino for f in setup.m1.files}
    replaced: list[str] = []
    real = os.replace
    trees = (str(ws.path(USER, NAME)) + "/", str(commit_mod.next_path(ws.path(USER, NAME))) + "/")

    def record(a, b, **kw):  # a name in the directory open at dst_dir_fd: its path in D or N
        if "dst_dir_fd" not in kw:  # the service's own records
            replaced.append(os.fspath(b))
        else:
            full = os.path.join(os.readlink(f"/proc/self/fd/{kw['dst_dir_fd']}"), b)
            replaced.append(next(full[len(t):] for t in trees if full.startswith(t)))
        return real(a, b, **kw)

    monkeypatch.setattr(os, "replace", record)
    setup.commit_v2(ws)
    monkeypatch.undo()
    m1 = {f.path: f for f in setup.m1.files}
    rewritten = {f.path for f in setup.m2.files if f.path not in m1 or m1[f.path] != f}
    assert set(replaced) >= rewritten and rewritten
    assert not {p for p in replaced if p in m1 and p not in rewritten}  # unchanged files: not relinked
    for f in setup.m2.files:
        if f.path in before and f.path not in rewritten:
            assert (ws.path(USER, NAME) / f.path).stat().st_ino == before[f.path], f.path
    assert setup.seen(ws) == "v2"
