"""hfai.multiprocessing.spawn + hfai.distributed.setup, and the synced suspend flag: every rank
gets the same answer at the same step even when only one rank's control file says so."""

from __future__ import annotations

import os
import socket

import pytest

# Starts processes (a cluster or torch workers): seconds each; `make test-fast` leaves it out.
pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")


def _worker(local_rank: int, control_dirs: list[str], out_dir: str) -> None:
    import hfai
    import hfai.distributed as dist

    os.environ["HFAI_CONTROL_DIR"] = control_dirs[local_rank]
    rank, world = dist.setup(local_rank, workers_per_node=2, backend="gloo", timeout_s=60)
    before = hfai.receive_suspend_command(sync=True)
    dist.barrier()
    if rank == 1:
        open(os.path.join(control_dirs[1], "suspend"), "w").close()
    dist.barrier()
    local = hfai.receive_suspend_command()
    synced = hfai.receive_suspend_command(sync=True)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)  # torch.distributed's API, reached through hfai.distributed
    with open(os.path.join(out_dir, f"rank{rank}"), "w") as f:
        f.write(f"{world} {before} {local} {synced} {t.item()}")
    dist.destroy_process_group()


def test_spawned_workers_agree_on_the_suspend_flag(tmp_path, monkeypatch):
    import hfai.multiprocessing

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "1", "RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    dirs = [tmp_path / "c0", tmp_path / "c1"]
    for d in dirs:
        d.mkdir()
    hfai.multiprocessing.spawn(_worker, args=([str(d) for d in dirs], str(tmp_path)), nprocs=2)
    r0 = (tmp_path / "rank0").read_text().split()
    r1 = (tmp_path / "rank1").read_text().split()
    assert r0 == ["2", "False", "False", "True", "3.0"]
    assert r1 == ["2", "False", "True", "True", "3.0"]
