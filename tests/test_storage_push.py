"""The fast push path without a cluster: staged packs on disk (whole or absent, rebuilt after a
restart, expired), a commit that copies staged bytes in the kernel, hashing in threads, the quick
check's inode, and the service serving a request while another is still being served."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from fakes import FakeMsg

from hfai.core.config import Config, StorageConfig
from hfai.protocol import decode
from hfai.protocol import storage as s
from hfai.protocol.errors import InvalidRequest
from hfai.storage import commit as commit_mod
from hfai.storage.chunks import build_manifest, chunk_hash, quick_index
from hfai.storage.staging import Staging, write_pack
from hfai.storage.workspace import Workspaces

CHUNK = 8


def _chunks(*datas: bytes) -> tuple[s.ChunkData, ...]:
    return tuple(s.ChunkData(hash=chunk_hash(d), data=d) for d in datas)


def test_staged_packs_are_whole_survive_a_restart_and_expire(tmp_path: Path):
    staging = Staging.open(tmp_path, ttl_s=100.0)
    a, b, c = b"a" * CHUNK, b"b" * CHUNK, b"c" * 3
    pack, listing = write_pack(staging.user_dir("alice"), _chunks(a, b))
    staging.added("alice", pack, listing)
    assert staging.held("alice") == {chunk_hash(a), chunk_hash(b)} and staging.held("bob") == set()
    assert staging.read("alice", chunk_hash(b)) == b
    # A restart: the index comes back from the files; a killed write's temporary file and a
    # damaged (short) pack are dropped, never counted.
    other, _ = write_pack(staging.user_dir("alice"), _chunks(c))
    (staging.user_dir("alice") / "x.pack.tmp").write_bytes(b"half")
    with open(other, "r+b") as f:
        f.truncate(os.path.getsize(other) - 1)
    again = Staging.open(tmp_path, ttl_s=100.0)
    assert again.held("alice") == {chunk_hash(a), chunk_hash(b)}
    assert sorted(p.name.endswith(".pack") for p in again.user_dir("alice").iterdir()) == [True]
    loc = again.locate("alice", chunk_hash(a))
    assert loc is not None and Path(loc.path).read_bytes()[loc.offset:loc.offset + loc.length] == a
    # Expiry by the pack's age; release only once every chunk of a pack is used.
    assert again.expire(now=os.stat(pack).st_mtime + 50) == 0
    assert again.release("alice", {chunk_hash(a)}) == 0
    assert again.expire(now=os.stat(pack).st_mtime + 101) == 1
    assert again.held("alice") == set() and not Path(pack).exists()


def test_a_chunk_that_does_not_match_its_hash_is_refused_and_nothing_written(tmp_path: Path):
    bad = (s.ChunkData(hash=chunk_hash(b"x" * CHUNK), data=b"y" * CHUNK),)
    with pytest.raises(InvalidRequest, match="does not match its content"):
        write_pack(tmp_path / "alice", bad)
    assert not (tmp_path / "alice").exists() or not list((tmp_path / "alice").iterdir())


def test_a_commit_copies_staged_chunks_in_the_kernel(tmp_path: Path, monkeypatch):
    ws = Workspaces(tmp_path / "ws", tmp_path / "state")
    staging = Staging.open(ws.root, ttl_s=100.0)
    body = os.urandom(5 * CHUNK + 3)
    parts = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]
    pack, listing = write_pack(staging.user_dir("alice"), _chunks(*parts))
    staging.added("alice", pack, listing)
    m = s.Manifest(files=(s.FileEntry(path="d/big.bin", size=len(body), mode=0o640,
                                      chunks=tuple(chunk_hash(p) for p in parts)),), chunk_bytes=CHUNK)
    copies = []
    real = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range", lambda *a: copies.append(a[2]) or real(*a))

    def never(h: str) -> bytes:
        raise AssertionError("a located chunk is copied, not read")

    commit_mod.commit(ws, "alice", "w", m, never, lambda h: staging.locate("alice", h))
    target = ws.path("alice", "w") / "d" / "big.bin"
    assert target.read_bytes() == body and (target.stat().st_mode & 0o777) == 0o640
    assert len(copies) == len(parts)


def test_a_one_chunk_file_staged_whole_is_linked_into_the_workspace_not_copied(tmp_path: Path, monkeypatch):
    from hfai.storage.staging import write_put

    ws = Workspaces(tmp_path / "ws", tmp_path / "state")
    staging = Staging.open(ws.root, ttl_s=100.0)
    small, other, big = b"s" * 5, b"o" * 3, os.urandom(2 * CHUNK + 1)
    parts = [big[i:i + CHUNK] for i in range(0, len(big), CHUNK)]
    whole = frozenset({chunk_hash(small), chunk_hash(other)})
    written = write_put(staging.user_dir("alice"), _chunks(small, other, small, *parts), whole)
    for w in written:
        staging.staged("alice", w)
    # Each whole chunk a file of exactly its bytes (once, though sent twice), the rest one pack.
    assert sorted(Path(p).suffix for p, _ in written) == [".one", ".one", ".pack"]
    one = Path(staging.locate("alice", chunk_hash(small)).path)
    assert one.read_bytes() == small and one.name.startswith(chunk_hash(small))
    # A restart finds them again, but not one cut short by a kill (its length is in its name).
    torn = one.with_name(f"{chunk_hash(b'torn!')}.5.x.one")
    torn.write_bytes(b"tor")
    assert Staging.open(ws.root, ttl_s=100.0).held("alice") == staging.held("alice") and not torn.exists()
    m = s.Manifest(files=(s.FileEntry(path="a/small.txt", size=5, mode=0o640, chunks=(chunk_hash(small),)),
                          s.FileEntry(path="b/same.txt", size=5, mode=0o644, chunks=(chunk_hash(small),)),
                          s.FileEntry(path="c/other", size=3, mode=0o600, chunks=(chunk_hash(other),)),
                          s.FileEntry(path="big.bin", size=len(big), chunks=tuple(chunk_hash(p) for p in parts))),
                   chunk_bytes=CHUNK)
    copies = []
    real = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range", lambda *a: copies.append(a[2]) or real(*a))
    commit_mod.commit(ws, "alice", "w", m, lambda h: staging.read("alice", h), lambda h: staging.locate("alice", h))
    d = ws.path("alice", "w")
    assert [(d / f.path).read_bytes() for f in m.files] == [small, small, other, big]
    # The first file of that content is the staged file itself; the second copies it (two
    # names of one inode would let a job's write to one change the other); the pack is copied.
    assert os.stat(d / "a/small.txt").st_ino == one.stat().st_ino
    assert os.stat(d / "b/same.txt").st_ino != one.stat().st_ino
    assert len(copies) == 1 + len(parts)
    assert [(d / f.path).stat().st_mode & 0o777 for f in m.files[:3]] == [0o640, 0o644, 0o600]
    # Once released, the workspace keeps the file; a staged file some workspace holds (a commit
    # finished, its release lost to a kill) is not counted as staged at a restart.
    assert Staging.open(ws.root, ttl_s=100.0).locate("alice", chunk_hash(small)) is None
    staging.release("alice", {h for f in m.files for h in f.chunks})
    assert not one.exists() and (d / "a/small.txt").read_bytes() == small
    assert os.stat(d / "a/small.txt").st_nlink == 1


def test_a_staged_whole_file_a_workspace_already_holds_is_not_copied_from(tmp_path: Path):
    """Between a commit's link and its release, a job may rewrite the linked file: another
    commit must not take that file's bytes for the chunk."""
    from hfai.storage.staging import write_put

    ws = Workspaces(tmp_path / "ws", tmp_path / "state")
    staging = Staging.open(ws.root, ttl_s=100.0)
    small = b"s" * 5
    [(path, placed)] = write_put(staging.user_dir("alice"), _chunks(small), frozenset({chunk_hash(small)}))
    staging.staged("alice", (path, placed))
    os.link(path, tmp_path / "held-by-a-workspace")
    with open(tmp_path / "held-by-a-workspace", "r+b") as f:
        f.write(b"JOB")
    m = s.Manifest(files=(s.FileEntry(path="x", size=10, chunks=(chunk_hash(small), chunk_hash(small))),),
                   chunk_bytes=5)
    with pytest.raises(Exception, match="no longer on the cluster"):
        commit_mod.commit(ws, "alice", "w", m, lambda h: (_ for _ in ()).throw(KeyError(h)),
                          lambda h: staging.locate("alice", h))


def test_a_file_sent_as_parts_is_written_at_its_places_survives_a_restart_and_is_linked(tmp_path: Path):
    import hashlib

    from hfai.storage.staging import write_put
    from hfai.storage.transport import packs, parts

    body = os.urandom(5 * CHUNK + 3)
    chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]
    f = s.FileEntry(path="w.bin", size=len(body), chunks=tuple(chunk_hash(c) for c in chunks))
    small = s.FileEntry(path="s", size=2, chunks=(chunk_hash(b"xy"),))
    where = {h: (f, i) for i, h in enumerate(f.chunks)} | {small.chunks[0]: (small, 0)}
    lacking = [small.chunks[0], *f.chunks]
    key = hashlib.sha256("\n".join(f.chunks).encode()).hexdigest()
    part_of = parts(lacking, where)
    assert part_of == {h: key for h in f.chunks}
    # Requests never mix a part file's chunks with others; a file not wholly sent is no part.
    sizes = {h: len(c) for h, c in zip(f.chunks, chunks, strict=True)} | {small.chunks[0]: 2}
    assert packs(lacking, sizes, 3 * CHUNK, part_of) == [[small.chunks[0]], list(f.chunks[:3]), list(f.chunks[3:])]
    assert parts(lacking[:-1], where) == {}
    ws = Workspaces(tmp_path / "ws", tmp_path / "state")
    staging = Staging.open(ws.root, ttl_s=100.0)
    d = staging.user_dir("alice")
    # The later chunks first (puts run at once, and a killed push resumes with the rest).
    for first in (3, 0):
        for w in write_put(d, _chunks(*chunks[first:first + 3]), part=staging.part_path("alice", key), first=first,
                           chunk_bytes=CHUNK):
            staging.staged("alice", w)
    part = Path(staging.part_path("alice", key))
    assert part.parent == d / key[:2] and part.name.startswith(key)
    assert part.read_bytes() == body and len(Path(f"{part}.idx").read_text().splitlines()) == 6
    # A restart reads the list back; a line for bytes the file does not hold is not trusted.
    with open(f"{part}.idx", "a") as idx:
        idx.write(f"{10 * CHUNK} {chunk_hash(b'later')} {CHUNK}\n")
    again = Staging.open(ws.root, ttl_s=100.0)
    assert again.held("alice") == set(f.chunks)
    assert again.locate("alice", f.chunks[4]) == staging.locate("alice", f.chunks[4])
    m = s.Manifest(files=(f,), chunk_bytes=CHUNK)
    commit_mod.commit(ws, "alice", "w", m, lambda h: again.read("alice", h), lambda h: again.locate("alice", h))
    target = ws.path("alice", "w") / "w.bin"
    assert target.read_bytes() == body and target.stat().st_ino == part.stat().st_ino
    again.release("alice", set(f.chunks))
    assert not part.exists() and not Path(f"{part}.idx").exists() and target.read_bytes() == body


def test_a_part_file_missing_chunks_is_copied_from_not_linked(tmp_path: Path):
    from hfai.storage.staging import write_put

    body = os.urandom(3 * CHUNK)
    chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]
    f = s.FileEntry(path="w.bin", size=len(body), chunks=tuple(chunk_hash(c) for c in chunks))
    ws = Workspaces(tmp_path / "ws", tmp_path / "state")
    staging = Staging.open(ws.root, ttl_s=100.0)
    d = staging.user_dir("alice")
    part = staging.part_path("alice", "k" * 64)
    for w in [*write_put(d, _chunks(*chunks[:2]), part=part, first=0, chunk_bytes=CHUNK),
              *write_put(d, _chunks(chunks[2]))]:
        staging.staged("alice", w)
    m = s.Manifest(files=(f,), chunk_bytes=CHUNK)
    commit_mod.commit(ws, "alice", "w", m, lambda h: staging.read("alice", h), lambda h: staging.locate("alice", h))
    target = ws.path("alice", "w") / "w.bin"
    assert target.read_bytes() == body and target.stat().st_ino != os.stat(part).st_ino


def test_a_part_file_a_workspace_holds_is_never_written_and_its_removal_spares_the_next(tmp_path: Path):
    from hfai.storage.staging import remove_packs, write_put

    staging = Staging.open(tmp_path, ttl_s=100.0)
    d = staging.user_dir("alice")
    a, b = os.urandom(CHUNK), os.urandom(CHUNK)
    first = staging.part_path("alice", "k" * 64)
    assert staging.part_path("alice", "k" * 64) == first  # puts already on their way share it
    staging.staged("alice", write_put(d, _chunks(a), part=first, first=0, chunk_bytes=CHUNK)[0])
    os.link(first, tmp_path / "in-a-workspace")  # a commit linked it; its removal has not run yet
    [(path, _)] = write_put(d, _chunks(b), part=first, first=1, chunk_bytes=CHUNK)
    assert path != first and (tmp_path / "in-a-workspace").read_bytes() == a
    # The commit's removal of the part it used leaves the next push's part file alone.
    staging.staged("alice", (path, [(chunk_hash(b), CHUNK, CHUNK)]))
    remove_packs(staging.forget("alice", {chunk_hash(a)}))
    assert not os.path.exists(first) and Path(path).read_bytes()[CHUNK:] == b
    assert staging.part_path("alice", "k" * 64) == path


def test_hashing_in_threads_gives_the_serial_manifest(tmp_path: Path):
    from hfai.storage import chunks

    sizes = [0, 1, CHUNK, chunks._TASK_CHUNKS * CHUNK, chunks._TASK_CHUNKS * CHUNK + 1, 3 * chunks._TASK_CHUNKS
             * CHUNK - 5]
    for i, n in enumerate(sizes):
        (tmp_path / f"f{i}").write_bytes(os.urandom(n))
    seen: list[int] = []
    threaded = build_manifest(tmp_path, CHUNK, on_bytes=seen.append, threads=4)
    serial = build_manifest(tmp_path, CHUNK, threads=1)
    assert threaded == serial and sum(seen) == sum(sizes)
    for i, n in enumerate(sizes):
        data = (tmp_path / f"f{i}").read_bytes()
        f = next(e for e in threaded.files if e.path == f"f{i}")
        assert f.size == n and f.chunks == tuple(chunk_hash(data[j:j + CHUNK]) for j in range(0, n, CHUNK))


def test_many_small_files_are_hashed_many_to_a_thread_call_and_give_the_serial_manifest(tmp_path: Path):
    from hfai.storage import chunks

    big = 2 * chunks._TASK_CHUNKS * CHUNK + 3
    sizes = [i % (2 * CHUNK) for i in range(300)] + [big]
    for i, n in enumerate(sizes):
        (tmp_path / f"d{i % 7}").mkdir(exist_ok=True)
        (tmp_path / f"d{i % 7}" / f"f{i:03d}").write_bytes(os.urandom(n))
    todo = [(f"d{i % 7}/f{i:03d}", n) for i, n in enumerate(sizes)]
    batches = chunks._batches(todo, CHUNK)
    # Small files share calls; the large one is still split across several, in order.
    assert len(batches) < len(sizes) // 4
    assert [t for b in batches for t in b if t[0] == todo[-1][0]] == [
        (todo[-1][0], 0, chunks._TASK_CHUNKS), (todo[-1][0], chunks._TASK_CHUNKS, chunks._TASK_CHUNKS),
        (todo[-1][0], 2 * chunks._TASK_CHUNKS, 1 << 62)]
    seen: list[int] = []
    threaded = build_manifest(tmp_path, CHUNK, on_bytes=seen.append, threads=3)
    assert threaded == build_manifest(tmp_path, CHUNK, threads=1) and sum(seen) == sum(sizes)
    for f in threaded.files:
        data = (tmp_path / f.path).read_bytes()
        assert f.chunks == tuple(chunk_hash(data[j:j + CHUNK]) for j in range(0, len(data), CHUNK))


def test_a_push_sends_no_more_a_request_than_the_server_delivers(nats_url):
    import nats

    from hfai.storage.client import ENVELOPE_BYTES, StorageClient

    async def main() -> tuple[int, int]:
        nc = await nats.connect(nats_url)
        try:
            client = StorageClient(Config())
            client.api._nc = nc
            return nc.max_payload, client.request_size(StorageConfig().request_bytes)
        finally:
            await nc.close()

    announced, size = asyncio.run(main())
    # A server left at NATS's default (1 MiB) gets less than the configured 4 MiB a request.
    assert announced == 1024 * 1024 < StorageConfig().request_bytes
    assert size == announced - ENVELOPE_BYTES


def test_the_service_has_nats_py_read_its_socket_a_megabyte_at_a_time(nats_url, monkeypatch):
    import nats.aio.client

    from hfai.core import nats as _nats
    from hfai.storage.service import READ_BYTES

    monkeypatch.setattr(nats.aio.client, "DEFAULT_BUFFER_SIZE", nats.aio.client.DEFAULT_BUFFER_SIZE)
    reads: list[int] = []

    async def main() -> int:
        _nats.read_in(READ_BYTES)
        nc = await nats.connect(nats_url)
        try:
            real = nc._transport.read
            nc._transport.read = lambda n: reads.append(n) or real(n)
            await nc.flush()  # a PONG read
            return nc._transport._io_reader._limit  # the stream reader pauses at twice that
        finally:
            await nc.close()

    assert asyncio.run(main()) == READ_BYTES == 1024 * 1024
    assert reads and set(reads) == {READ_BYTES}


def test_an_unchanged_tree_is_told_from_the_index_alone_and_any_change_shows(tmp_path: Path):
    from hfai.storage.chunks import scan, unchanged_tree

    (tmp_path / "d").mkdir()
    for name in ("a", "d/b"):
        (tmp_path / name).write_bytes(os.urandom(3 * CHUNK))
    stamps: dict = {}
    index = quick_index(tmp_path, build_manifest(tmp_path, CHUNK, stamps=stamps), stamps)
    assert unchanged_tree(scan(tmp_path), index)
    # An index entry without the mode (a damaged index) never says "unchanged": the manifest is made.
    assert not unchanged_tree(scan(tmp_path), {k: v[:4] for k, v in index.items()})
    os.chmod(tmp_path / "a", 0o600)
    assert not unchanged_tree(scan(tmp_path), index)
    os.chmod(tmp_path / "a", index["a"][4])
    assert unchanged_tree(scan(tmp_path), index)
    st = os.stat(tmp_path / "d/b")
    os.utime(tmp_path / "d/b", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert not unchanged_tree(scan(tmp_path), index)
    os.utime(tmp_path / "d/b", ns=(st.st_atime_ns, st.st_mtime_ns))
    (tmp_path / "new").write_bytes(b"")
    assert not unchanged_tree(scan(tmp_path), index)
    (tmp_path / "new").unlink()
    (tmp_path / "a").unlink()
    assert not unchanged_tree(scan(tmp_path), {k: v for k, v in index.items() if k != "d/b"})
    assert not unchanged_tree(scan(tmp_path), index)


def test_the_quick_check_rereads_a_file_replaced_with_the_same_size_and_mtime(tmp_path: Path):
    (tmp_path / "a").write_bytes(b"old!")
    stamps: dict = {}
    first = build_manifest(tmp_path, 4, stamps=stamps)
    known = quick_index(tmp_path, first, stamps)
    st = os.stat(tmp_path / "a")
    (tmp_path / "new").write_bytes(b"new!")
    os.utime(tmp_path / "new", ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp_path / "new", tmp_path / "a")  # same size and mtime, another inode
    again = build_manifest(tmp_path, 4, known=known)
    assert again.files[0].chunks == (chunk_hash(b"new!"),)


def test_the_service_answers_while_another_request_is_still_being_served(tmp_path: Path):
    """nats-py awaits a subscription's callback before handing over the next message: a commit
    served inside it held up its own client's liveness pings (reported as a hung service)."""
    from hfai.storage.service import StorageService

    sc = StorageConfig(workspace_root=str(tmp_path / "ws"), state_dir=str(tmp_path / "state"))
    svc = StorageService(Config(storage=sc))

    async def go() -> None:
        svc._staging = Staging.open(sc.workspace_root, sc.staging_ttl_s)
        release = asyncio.Event()

        async def slow(user, op, req):
            await release.wait()
            return s.WorkspaceList(workspaces=())

        svc._handlers[s.VERB_WS_LIST] = slow
        replies: asyncio.Queue = asyncio.Queue()
        # Bounded: before the fix the first call itself waited for the slow handler.
        await asyncio.wait_for(svc.handle(FakeMsg("hfai.storage.alice.ws_list", s.ListWorkspaces(), replies)), 10)
        await svc.handle(FakeMsg("hfai.storage.alice.ws_commit_status", s.WorkspaceRequest(workspace="w"), replies))
        first = decode(await asyncio.wait_for(replies.get(), 10), s.CommitStatus)
        assert first == s.CommitStatus(workspace="w", committing=False)
        release.set()
        assert decode(await asyncio.wait_for(replies.get(), 10), s.WorkspaceList) == s.WorkspaceList(workspaces=())
        await svc.close()

    asyncio.run(go())


def test_a_filesystem_without_copy_file_range_gets_the_bytes_written(tmp_path: Path, monkeypatch):
    import errno

    ws = Workspaces(tmp_path / "ws", tmp_path / "state")
    staging = Staging.open(ws.root, ttl_s=100.0)
    parts = [os.urandom(CHUNK), os.urandom(5)]
    pack, listing = write_pack(staging.user_dir("alice"), _chunks(*parts))
    staging.added("alice", pack, listing)
    m = s.Manifest(files=(s.FileEntry(path="f", size=CHUNK + 5, mode=0o644,
                                      chunks=tuple(chunk_hash(p) for p in parts)),), chunk_bytes=CHUNK)

    def refuse(*_a):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "copy_file_range", refuse)
    commit_mod.commit(ws, "alice", "w", m, lambda h: staging.read("alice", h), lambda h: staging.locate("alice", h))
    assert (ws.path("alice", "w") / "f").read_bytes() == b"".join(parts)


@pytest.mark.parametrize("rel, is_dir", [
    (".hfai", True), (".git", True), ("a/.git", True), ("a/.hfai", True), (".git", False), ("a/.git", False),
    (".git/config", False), ("a/.hfai/x", False), ("src", True), ("src/a.py", False), (".gitignore", False),
    (".github", True), ("x.hfai", False),
])
def test_without_a_hfignore_the_always_ignored_rules_match_pathspecs(rel, is_dir):
    import pathspec

    from hfai.storage.ignore import ALWAYS_IGNORED, Ignore

    spec = pathspec.GitIgnoreSpec.from_lines(list(ALWAYS_IGNORED))
    assert Ignore([]).ignored(rel, is_dir) == spec.match_file(rel + "/" if is_dir else rel)
    assert Ignore(["# a comment", ""]).ignored(rel, is_dir) == spec.match_file(rel + "/" if is_dir else rel)


def _committed(ws: Workspaces, files: dict[str, bytes]) -> s.Manifest:
    """Commit ``files`` (path -> bytes, a chunk or two each) as alice's workspace w, from staging."""
    staging = Staging.open(ws.root, ttl_s=100.0)
    entries, datas = [], []
    for path, body in files.items():
        parts = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]
        datas += parts
        entries.append(s.FileEntry(path=path, size=len(body), mode=0o644, chunks=tuple(chunk_hash(p) for p in parts)))
    pack, listing = write_pack(staging.user_dir("alice"), _chunks(*dict.fromkeys(datas)))
    staging.added("alice", pack, listing)
    m = s.Manifest(files=tuple(entries), chunk_bytes=CHUNK)
    commit_mod.commit(ws, "alice", "w", m, lambda h: staging.read("alice", h), lambda h: staging.locate("alice", h))
    return m


def test_the_chunks_a_workspace_holds_are_answered_from_the_files_that_list_them(tmp_path: Path, monkeypatch):
    ws = Workspaces(tmp_path / "ws", tmp_path / "state")
    files = {f"d/f{i}": os.urandom(CHUNK + 2) for i in range(50)}
    m = _committed(ws, files)
    f3, f4 = m.files[3], m.files[4]
    looked: list[list[str]] = []
    real = ws._sizes
    monkeypatch.setattr(ws, "_sizes", lambda user, name, paths: looked.append(list(paths)) or real(user, name, paths))
    # One edited file's question: its chunks alone, one file looked at, not the tree.
    assert ws.holding("alice", "w", [*f3.chunks, chunk_hash(b"never pushed")]) == set(f3.chunks)
    assert looked == [["d/f3"]]
    # A file cut short or removed on the cluster holds none of its chunks any more; held() agrees.
    with open(ws.path("alice", "w") / "d" / "f4", "r+b") as out:
        out.truncate(CHUNK)
    (ws.path("alice", "w") / "d" / "f3").unlink()
    everything = [h for f in m.files for h in f.chunks]
    assert ws.holding("alice", "w", everything) == set(ws.held("alice", "w")) == \
        set(everything) - set(f3.chunks) - set(f4.chunks)
    assert ws.holding("alice", "nothing", everything) == set()


def test_a_used_side_tree_is_renamed_aside_and_removed_later_or_at_start(tmp_path: Path):
    from hfai.storage.workspace import remove_trees

    ws = Workspaces(tmp_path / "ws", tmp_path / "state", defer_removal=True)
    _committed(ws, {"a": b"1" * CHUNK, "b": b"2" * 3})
    _committed(ws, {"a": b"3" * CHUNK, "b": b"2" * 3})  # the second commit builds and swaps a side tree
    user_dir = ws.root / "alice"
    gone = ws.take_discarded()
    assert len(gone) == 1 and gone[0].parent == user_dir and gone[0].name.startswith(commit_mod.GONE_PREFIX)
    assert sorted(p.name for p in user_dir.iterdir()) == sorted(["w", gone[0].name])  # no .hfai-next- left
    assert (ws.path("alice", "w") / "a").read_bytes() == b"3" * CHUNK
    remove_trees(gone)
    assert [p.name for p in user_dir.iterdir()] == ["w"] and ws.take_discarded() == []
    # One a killed service never removed goes at the next start.
    _committed(ws, {"a": b"4" * CHUNK})
    assert len(list(user_dir.glob(commit_mod.GONE_PREFIX + "*"))) == 1
    Workspaces(tmp_path / "ws", tmp_path / "state").recover()
    assert [p.name for p in user_dir.iterdir()] == ["w"] and (ws.path("alice", "w") / "a").read_bytes() == b"4" * CHUNK


def test_a_push_presumes_there_only_the_chunks_of_files_sent_exactly_so_last_time():
    from hfai.storage.manifest import presumed_there

    same = s.FileEntry(path="same", size=3, mode=0o644, chunks=("h1",))
    edited = s.FileEntry(path="edited", size=3, mode=0o644, chunks=("h3",))
    grown = s.FileEntry(path="grown", size=20, mode=0o644, chunks=("h4", "h5"))
    new = s.FileEntry(path="new", size=1, mode=0o644, chunks=("h6",))
    known = {"same": [3, 1, ["h1"], 7, 0o644], "edited": [3, 1, ["h2"], 8, 0o644], "grown": [10, 1, ["h4"], 9, 0o644],
             "gone": [1, 1, ["h9"], 10, 0o644]}
    m = s.Manifest(files=(same, edited, grown, new), chunk_bytes=16)
    assert presumed_there(m, known) == {"h1"}
    assert presumed_there(m, {}) == set()


def test_a_commit_request_carries_its_manifest_packed_once_and_the_service_records_those_bytes():
    from hfai.protocol import encode
    from hfai.protocol.codec import encode_packed, pack
    from hfai.storage import rules
    from hfai.storage.manifest import digest_and_packed
    from hfai.storage.service import packed_field

    m = s.Manifest(files=tuple(s.FileEntry(path=f"d/{i}", size=i, mode=0o600, chunks=(chunk_hash(bytes([i])),))
                               for i in range(30)), chunk_bytes=CHUNK)
    digest, body = digest_and_packed(m)
    assert digest == rules.manifest_digest(m) and body == pack(m)
    request = s.CommitRequest(workspace="w", manifest=m)
    data = encode_packed(request, manifest=body).data
    assert data == encode(request) and decode(data, s.CommitRequest) == request
    assert packed_field(data, "manifest") == body and packed_field(data, "workspace") == pack("w")
    assert packed_field(encode(s.WorkspaceRequest(workspace="w")), "manifest") is None
    assert packed_field(b"\xc1 not msgpack", "manifest") is None and packed_field(b"", "manifest") is None
    # A key given twice: decoding keeps the last, the manifest decode() checked; so does packed_field,
    # or an unchecked first manifest (a path out of the workspace) would be what the service records.
    import msgpack

    escape = s.Manifest(files=(s.FileEntry(path="../escape", size=1, chunks=(chunk_hash(b"x"),)),), chunk_bytes=CHUNK)
    head = data[:len(data) - len(pack(request))]
    twice = head + b"\x83" + msgpack.packb("workspace") + msgpack.packb("w") + msgpack.packb("manifest") + \
        pack(escape) + msgpack.packb("manifest") + body
    assert decode(twice, s.CommitRequest).manifest == m and packed_field(twice, "manifest") == body
    envelope = msgpack.unpackb(data)
    twice_b = b"".join([b"\x84", msgpack.packb("k"), msgpack.packb(envelope["k"]), msgpack.packb("v"),
                        msgpack.packb(envelope["v"]), msgpack.packb("b"),
                        pack(s.CommitRequest(workspace="w", manifest=escape)), msgpack.packb("b"), pack(request)])
    assert decode(twice_b, s.CommitRequest).manifest == m and packed_field(twice_b, "manifest") == body


def test_init_under_another_name_forgets_what_the_last_push_recorded(tmp_path: Path):
    import json

    from hfai.api.workspace import MARKER_DIR, Marker, read_marker, write_marker
    from hfai.storage.marker import QUICK, init

    init(tmp_path, "first")
    write_marker(tmp_path, Marker("first", remote="/ws/alice/first", pushed_ts=1.0))
    (tmp_path / MARKER_DIR / QUICK).write_text("{}")
    init(tmp_path, "first")  # the same name again: nothing forgotten
    assert read_marker(tmp_path).remote == "/ws/alice/first" and (tmp_path / MARKER_DIR / QUICK).exists()
    init(tmp_path, "second")
    assert read_marker(tmp_path) == Marker("second")
    assert json.loads((tmp_path / MARKER_DIR / "workspace.json").read_text()) == {"name": "second"}
    assert not (tmp_path / MARKER_DIR / QUICK).exists()


def test_new_files_are_left_unhashed_and_the_rest_hashed(tmp_path: Path):
    """A first push reads a new file once (to send it); a file of the size it had at the last
    push (maybe only touched), a file of several chunks at another size (an appended log keeps
    most of them), or one a killed push began to send unhashed (listed at its size with no
    chunks), is hashed as before."""
    from hfai.storage.chunks import sent_unhashed

    (tmp_path / "new.txt").write_bytes(b"new")
    (tmp_path / "grown.txt").write_bytes(b"grown!")
    (tmp_path / "touched.txt").write_bytes(b"same")
    (tmp_path / "big.bin").write_bytes(os.urandom(2 * CHUNK + 1))
    (tmp_path / "begun.bin").write_bytes(os.urandom(3 * CHUNK))
    (tmp_path / "appended.log").write_bytes(os.urandom(3 * CHUNK))
    (tmp_path / "empty").write_bytes(b"")
    with open(tmp_path / "sparse.bin", "wb") as f:  # preallocated: a hole of 64 KiB, then a byte
        f.truncate(1 << 16)
        f.seek(0, os.SEEK_END)
        f.write(b"x")
    st = {p.name: p.stat() for p in tmp_path.iterdir()}
    known = {"grown.txt": [3, 1, ["x"], st["grown.txt"].st_ino, 0o644],
             "touched.txt": [4, 1, ["y"], st["touched.txt"].st_ino, 0o644],
             "appended.log": [2 * CHUNK, 1, ["a", "b"], st["appended.log"].st_ino, 0o644],
             "begun.bin": [3 * CHUNK, st["begun.bin"].st_mtime_ns, [], st["begun.bin"].st_ino, 0o644]}
    unhashed: list[int] = []
    m = build_manifest(tmp_path, CHUNK, known=known, unhashed=unhashed)
    left = sorted(m.files[i].path for i in unhashed)
    assert left == ["big.bin", "grown.txt", "new.txt"]
    assert all(m.files[i].chunks == () and m.files[i].size == st[m.files[i].path].st_size for i in unhashed)
    serial = {f.path: f for f in build_manifest(tmp_path, CHUNK, known=known).files}
    for f in m.files:  # the rest exactly as a manifest hashing everything has them
        assert f == serial[f.path] or f.path in left
    assert len(serial["begun.bin"].chunks) == len(serial["appended.log"].chunks) == 3
    assert sent_unhashed(None, st["new.txt"], CHUNK) and not sent_unhashed(None, st["empty"], CHUNK)
    assert sent_unhashed(None, st["big.bin"], CHUNK)
    # Its repeated zero chunks are sent once if hashed (where the filesystem keeps the hole).
    holes = st["sparse.bin"].st_blocks * 512 < st["sparse.bin"].st_size
    assert sent_unhashed(None, st["sparse.bin"], CHUNK) is not holes


def test_the_service_names_unhashed_chunks_and_stages_them_whole(tmp_path: Path):
    from hfai.storage.staging import stage_put

    staging = Staging.open(tmp_path / "ws", ttl_s=100.0)
    d = staging.user_dir("alice")
    a, b, c = b"aaaa", b"bb", b"named"
    staged, names = stage_put(d, (s.ChunkData(hash="", data=a), *_chunks(c), s.ChunkData(hash="", data=b)))
    assert names == (chunk_hash(a), chunk_hash(c), chunk_hash(b))
    for w in staged:
        staging.staged("alice", w)
    for data in (a, b):  # each a file of exactly its bytes, as a one-chunk file sent named is
        where = staging.locate("alice", chunk_hash(data))
        assert where.path.endswith(".one") and Path(where.path).read_bytes() == data
    assert staging.read("alice", chunk_hash(c)) == c
    # A named chunk is still checked, and a put of named chunks only answers no names.
    with pytest.raises(InvalidRequest, match="does not match"):
        stage_put(d, (s.ChunkData(hash="", data=a), s.ChunkData(hash=chunk_hash(b"other"), data=b"forged")))
    assert stage_put(d, _chunks(b"plain"))[1] == ()


def test_the_service_names_a_large_unhashed_files_chunks_at_their_places_and_the_commit_links_it(tmp_path: Path):
    """A new file of several chunks is sent unhashed in puts of a key of the push's own: the
    service names each chunk, writes it at its place in one part file, and the commit links that."""
    from hfai.storage.staging import stage_put

    body = os.urandom(5 * CHUNK + 3)
    chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]
    ws = Workspaces(tmp_path / "ws", tmp_path / "state")
    staging = Staging.open(ws.root, ttl_s=100.0)
    d = staging.user_dir("alice")
    key = os.urandom(32).hex()
    names: dict[int, str] = {}
    for first in (3, 0):  # puts run at once: in any order
        staged, got = stage_put(d, tuple(s.ChunkData(hash="", data=c) for c in chunks[first:first + 3]),
                                part=staging.part_path("alice", key), first=first, chunk_bytes=CHUNK)
        names.update(enumerate(got, start=first))
        for w in staged:
            staging.staged("alice", w)
    f = s.FileEntry(path="w.bin", size=len(body), chunks=tuple(names[i] for i in range(len(chunks))))
    assert f.chunks == tuple(chunk_hash(c) for c in chunks)
    part = Path(staging.part_path("alice", key))
    assert part.read_bytes() == body
    commit_mod.commit(ws, "alice", "w", s.Manifest(files=(f,), chunk_bytes=CHUNK),
                      lambda h: staging.read("alice", h), lambda h: staging.locate("alice", h))
    target = ws.path("alice", "w") / "w.bin"
    assert target.read_bytes() == body and target.stat().st_ino == part.stat().st_ino
    # A named chunk among them is still checked.
    with pytest.raises(InvalidRequest, match="does not match"):
        stage_put(d, (s.ChunkData(hash="", data=b"a"), s.ChunkData(hash=chunk_hash(b"b"), data=b"forged")),
                  part=staging.part_path("alice", os.urandom(32).hex()), chunk_bytes=CHUNK)


def test_a_large_file_is_read_unhashed_at_its_walked_size_or_not_at_all(tmp_path: Path):
    from hfai.storage.chunks import read_part

    body = os.urandom(3 * CHUNK + 2)
    (tmp_path / "w.bin").write_bytes(body)
    f = s.FileEntry(path="w.bin", size=len(body))
    assert b"".join(read_part(tmp_path, f, 0, 2, CHUNK) + read_part(tmp_path, f, 2, 2, CHUNK)) == body
    for changed in (body + b"more", body[:-1], body[:CHUNK]):  # grown, cut short: the walk's size is wrong
        (tmp_path / "w.bin").write_bytes(changed)
        with pytest.raises(InvalidRequest, match="changed while it was pushed"):
            read_part(tmp_path, f, 0, 4, CHUNK)


def test_the_names_the_service_gave_complete_the_manifest_and_the_journal_outlives_a_kill(tmp_path: Path):
    from hfai.api.workspace import MARKER_DIR
    from hfai.storage.chunks import scan
    from hfai.storage.manifest import indexed, named
    from hfai.storage.marker import SENT, Journal, init, read_known

    init(tmp_path, "w")
    (tmp_path / "a.txt").write_bytes(b"alpha")
    (tmp_path / "b.txt").write_bytes(b"be")
    unhashed: list[int] = []
    m = build_manifest(tmp_path, CHUNK, unhashed=unhashed)
    out = indexed(m, unhashed)
    assert out.sending == out.chunks == 2 and out.bytes == 7 and out.lacking == ()
    journal = Journal(tmp_path, scan(tmp_path))
    journal.add([(out.unhashed[0], (chunk_hash(b"alpha"),), 5)])
    journal.close()
    (tmp_path / MARKER_DIR / SENT).open("a").write('["b.txt", 2, 1')  # a line cut short by a kill
    known, last = read_known(tmp_path, CHUNK)
    assert last == "" and list(known) == ["a.txt"]
    # The next manifest takes a.txt from the journal, unread; b.txt is still to send.
    unhashed = []
    again = build_manifest(tmp_path, CHUNK, known=known, unhashed=unhashed)
    assert [again.files[i].path for i in unhashed] == ["b.txt"]
    assert again.files[0].chunks == (chunk_hash(b"alpha"),)
    done = named(indexed(again, unhashed), {"b.txt": ((chunk_hash(b"be"),), 2)}, CHUNK)
    assert done.manifest == build_manifest(tmp_path, CHUNK)
    assert done.lacking == (chunk_hash(b"be"),) and done.unhashed == ()


def test_a_large_file_sent_unhashed_is_named_whole_and_a_killed_push_hashes_it_next_time(tmp_path: Path):
    """The names of a large file's chunks complete its entry; the journal lists it before its
    first put (at its size, no chunks), so the next push after a kill hashes it and asks which of
    its chunks the cluster lacks, where sending it unhashed again would send every chunk."""
    from hfai.storage.chunks import scan
    from hfai.storage.manifest import indexed, named
    from hfai.storage.marker import Journal, init, read_known

    init(tmp_path, "w")
    body = os.urandom(4 * CHUNK + 1)
    (tmp_path / "big.bin").write_bytes(body)
    unhashed: list[int] = []
    m = build_manifest(tmp_path, CHUNK, unhashed=unhashed)
    out = indexed(m, unhashed)
    assert out.sending == out.chunks == 5 and out.bytes == len(body) and out.files() == [("big.bin", 5, len(body))]
    names = tuple(chunk_hash(body[i:i + CHUNK]) for i in range(0, len(body), CHUNK))
    done = named(out, {"big.bin": (names, len(body))}, CHUNK)
    assert done.manifest == build_manifest(tmp_path, CHUNK) and done.lacking == names
    journal = Journal(tmp_path, scan(tmp_path))
    journal.add([(out.unhashed[0], (), len(body))])  # begun, then killed
    journal.close()
    known, last = read_known(tmp_path, CHUNK)
    assert last == "" and known["big.bin"][0] == len(body) and known["big.bin"][2] == []
    unhashed = []
    again = build_manifest(tmp_path, CHUNK, known=known, unhashed=unhashed)
    assert unhashed == [] and again == build_manifest(tmp_path, CHUNK)


def test_a_push_process_keeps_the_memory_it_frees_for_its_next_buffers():
    """A push makes fresh buffers of megabytes for every request; glibc, left as it is, maps and
    unmaps each, so each of their pages is faulted in anew (keep_freed_memory). Each way in a
    process of its own: the setting is the process's."""
    import subprocess
    import sys

    script = """
import resource, sys
if sys.argv[1] == "keep":
    from hfai.cli.workspace import keep_freed_memory
    keep_freed_memory()
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
b = bytes(4 << 20); del b
f0 = faults()
for i in range(50):
    b = bytearray(4 << 20); b[::4096] = bytes(len(b[::4096])); c = bytes(b); del b, c
print(faults() - f0)
"""
    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's allocator only")
    got = {how: int(subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True,
                                   check=True).stdout) for how in ("keep", "as-is")}
    # 50 rounds of two 4 MiB buffers: 40,000-100,000 faults as glibc is, a few thousand once kept.
    assert got["as-is"] > 20_000 and got["keep"] < got["as-is"] // 5, got
