"""A workspace whose manifest, chunk names or file count outgrow one NATS message is pushed and
pulled all the same, in pieces that fit the max_payload the server announces (issue 38 §5), and a
push that fails for any reason ends with a typed error, never a traceback. A real nats-server with
a small max_payload, the storage service and client in this process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from spine_cluster import start_nats

from hfai.core.config import Config, NatsConfig, StorageConfig
from hfai.protocol import encode
from hfai.protocol.errors import HfaiError
from hfai.protocol.storage import CommitRequest
from hfai.storage import client as sclient
from hfai.storage import manifest, marker, pull, transport
from hfai.storage import push as storage_push
from hfai.storage.chunks import build_manifest
from hfai.storage.service import StorageService

MAX_PAYLOAD = 128 * 1024
CHUNK = 1024
FILES = 3000  # ~330 KB of manifest, and ~3,000 tiny new files: names of them all in one reply


@pytest.fixture
def small_nats(tmp_path):
    conf = tmp_path / "nats.conf"
    conf.write_text(f"max_payload: {MAX_PAYLOAD}\n")
    proc, url = start_nats(tmp_path / "js", tmp_path / "nats.log", config_file=conf)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def _config(tmp_path: Path, url: str) -> Config:
    # A request's time limit with room for a loaded machine: the sizes are what is tested here.
    return Config(nats=NatsConfig(url=url, request_timeout_s=30.0),
                  storage=StorageConfig(workspace_root=str(tmp_path / "root"), state_dir=str(tmp_path / "state"),
                                        chunk_bytes=CHUNK, request_bytes=64 * 1024))


def _tree(root: Path) -> dict[str, bytes]:
    files = {f"d{i // 100:02d}/some/longer/path/file-{i:05d}.txt": f"file {i}\n".encode() for i in range(FILES)}
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


async def _with_service(config: Config, work):
    svc = StorageService(config)
    await svc.start()
    try:
        async with sclient.StorageClient(config, user="alice") as client:
            return await work(client)
    finally:
        await svc.close()


def test_a_tree_whose_manifest_is_over_max_payload_is_pushed_and_pulled(tmp_path, small_nats, monkeypatch):
    monkeypatch.setenv("HFAI_HOME", str(tmp_path / "home"))
    config = _config(tmp_path, small_nats)
    root = tmp_path / "local"
    files = _tree(root)
    marker.init(root, "big")
    m = build_manifest(root, CHUNK)
    assert len(encode(CommitRequest(workspace="big", manifest=m))) > MAX_PAYLOAD  # the case at hand

    async def push_edit_pull(client):
        first = await storage_push.push(client, root, CHUNK, config.storage.request_bytes, 60.0)
        (root / "d00/some/longer/path/file-00000.txt").write_bytes(b"edited\n")
        second = await storage_push.push(client, root, CHUNK, config.storage.request_bytes, 60.0)
        pulled = await pull.pull(client, "big", tmp_path / "pulled", config.storage.request_bytes)
        # The local index lost: every chunk is hashed and asked about (in batches that fit).
        (root / ".hfai" / marker.QUICK).unlink()
        (root / "d01/some/longer/path/file-00100.txt").write_bytes(b"edited too\n")
        third = await storage_push.push(client, root, CHUNK, config.storage.request_bytes, 60.0)
        return first, second, pulled, third

    first, second, pulled, third = asyncio.run(_with_service(config, push_edit_pull))
    assert first.files == FILES and second.sent_chunks == 1 and pulled == FILES and third.sent_chunks == 1
    remote = tmp_path / "root" / "alice" / "big"
    files["d00/some/longer/path/file-00000.txt"] = b"edited\n"
    pulled_files = dict(files)
    files["d01/some/longer/path/file-00100.txt"] = b"edited too\n"
    for rel, data in files.items():
        assert (remote / rel).read_bytes() == data, rel
        assert (tmp_path / "pulled" / rel).read_bytes() == pulled_files[rel], rel


def test_a_push_the_server_refuses_ends_with_a_typed_error(tmp_path, small_nats, monkeypatch):
    """Whatever goes wrong on the wire (here: a request over max_payload, as a client that
    assumed a size would send), the push raises an HfaiError: the CLI prints one line."""
    monkeypatch.setenv("HFAI_HOME", str(tmp_path / "home"))
    config = _config(tmp_path, small_nats)
    root = tmp_path / "local"
    (root / "a").mkdir(parents=True)
    (root / "a" / "big.bin").write_bytes(b"x" * 4 * CHUNK)
    marker.init(root, "w")
    monkeypatch.setattr(sclient.StorageClient, "request_size", lambda self, configured: 4 * MAX_PAYLOAD)

    async def push(client):
        return await storage_push.push(client, root, 2 * MAX_PAYLOAD, 4 * MAX_PAYLOAD, 60.0)

    (root / "a" / "big.bin").write_bytes(b"x" * 3 * MAX_PAYLOAD)
    with pytest.raises(HfaiError, match="max_payload"):
        asyncio.run(_with_service(config, push))


def test_a_file_gone_during_the_push_ends_with_a_typed_error(tmp_path, small_nats, monkeypatch):
    monkeypatch.setenv("HFAI_HOME", str(tmp_path / "home"))
    config = _config(tmp_path, small_nats)
    root = tmp_path / "local"
    (root / "a").mkdir(parents=True)
    for i in range(3):
        (root / "a" / f"f{i}").write_bytes(b"x" * (3 * CHUNK))
    marker.init(root, "w")

    async def push(client):
        walked = manifest.start_scan(root)
        await walked
        (root / "a" / "f1").unlink()  # after the walk listed it, before it is read
        return await storage_push.push(client, root, CHUNK, config.storage.request_bytes, 60.0, walking=walked)

    with pytest.raises(HfaiError, match="a/f1"):
        asyncio.run(_with_service(config, push))


def test_a_put_of_many_tiny_files_is_bounded_by_their_count_and_fits_a_message():
    """CHUNK_COST covers what a chunk adds to a put beside its bytes (its name, again in
    ``whole``, and in the reply), so the largest put packs() makes encodes within max_payload."""
    from hfai.protocol import storage as s

    hs = [f"{i:064x}" for i in range(5000)]
    sizes = {h: 10 for h in hs}
    room = MAX_PAYLOAD - sclient.FRAME_BYTES
    groups = transport.packs(hs, sizes, 4 * 1024 * 1024, message_bytes=room, max_chunks=transport.PUT_CHUNKS)
    assert [h for g in groups for h in g] == hs and max(len(g) for g in groups) <= transport.PUT_CHUNKS
    biggest = max(groups, key=len)
    put = s.PutRequest(workspace="w" * 64, chunks=tuple(s.ChunkData(hash=h, data=b"x" * 10) for h in biggest),
                       whole=tuple(biggest), file="k" * 64, first=2**31)
    reply = s.PutReply(stored=len(biggest), hashes=tuple(biggest))
    assert len(encode(put)) <= MAX_PAYLOAD and len(encode(reply)) <= MAX_PAYLOAD
    assert len(transport.packs(hs, sizes, 4 * 1024 * 1024, max_chunks=1000)) == 5


def test_a_manifest_over_one_message_s_size_is_recorded_and_read_back(tmp_path):
    """A tree of 100,000 files has a manifest of some 11 MB, over the 8 MiB any one message may
    be: the service's record of it (and its commit journal) must still read back."""
    from hfai.protocol.codec import MAX_MESSAGE_BYTES
    from hfai.protocol.storage import FileEntry, Manifest
    from hfai.storage.workspace import Workspaces

    h = "ab" * 32
    m = Manifest(files=tuple(FileEntry(path=f"d{i // 1000:03d}/file-{i:07d}.py", size=9, chunks=(h,))
                             for i in range(90_000)), chunk_bytes=CHUNK)
    ws = Workspaces(tmp_path / "root", tmp_path / "state")
    ws.save_manifest("alice", "big", m)
    assert ws._manifest_path("alice", "big").stat().st_size > MAX_MESSAGE_BYTES
    ws._decoded.clear()
    assert ws.manifest("alice", "big") == m


def test_the_service_says_it_is_committing_while_it_decodes_a_manifest_sent_in_pieces(tmp_path, monkeypatch):
    """A million files' manifest takes the service seconds to decode: all that time the client's
    liveness pings (ws_commit_status) must hear "committing", or it reports the service as
    restarted and gives up on a commit that is going fine."""
    import hashlib
    import threading

    from fakes import FakeMsg

    from hfai.protocol import decode
    from hfai.protocol import storage as s
    from hfai.storage import service as service_mod
    from hfai.storage.staging import Staging

    sc = StorageConfig(workspace_root=str(tmp_path / "root"), state_dir=str(tmp_path / "state"), chunk_bytes=CHUNK)
    svc = StorageService(Config(storage=sc))
    whole = encode(s.Manifest(chunk_bytes=CHUNK))
    upload = "0" * 32
    entered, go_on = threading.Event(), threading.Event()
    real = service_mod.decode

    def slow_manifest(data, kind, **kw):
        if kind is s.Manifest:
            entered.set()
            go_on.wait(60)
        return real(data, kind, **kw)

    monkeypatch.setattr(service_mod, "decode", slow_manifest)

    async def main() -> tuple[s.CommitStatus, s.WorkspaceInfo]:
        svc._staging = Staging.open(sc.workspace_root, sc.staging_ttl_s)
        svc.uploads.clear()
        svc.uploads.write("alice", upload, 0, len(whole), whole)
        replies: asyncio.Queue = asyncio.Queue()
        request = s.CommitRequest(workspace="w", manifest=s.Manifest(), upload=upload,
                                  digest=hashlib.sha256(whole).hexdigest())
        await svc.handle(FakeMsg("hfai.storage.alice.ws_commit", request, replies))
        await asyncio.to_thread(entered.wait, 60)
        await svc.handle(FakeMsg("hfai.storage.alice.ws_commit_status", s.WorkspaceRequest(workspace="w"), replies))
        status = decode(await replies.get(), s.CommitStatus)
        go_on.set()
        info = decode(await replies.get(), s.WorkspaceInfo)
        await svc.close()
        return status, info

    status, info = asyncio.run(main())
    assert status.committing and info.name == "w"
