"""Checkpoints as the hfai-models scripts use them, on two gloo ranks: save(fname, model, ...) of a
model under the hfreduce DDP takes buffers from one rank and refuses ranks whose parameters differ;
hfai.checkpoint.init + model.try_save resume a job that a real suspend flag interrupted."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import hfai.checkpoint as ckpt  # noqa: E402
from hfai.protocol.errors import HfaiError  # noqa: E402


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    # Many buffers of several sizes, so that today's byte balancing would spread them over ranks.
    return torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 32),
                               torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 256), torch.nn.BatchNorm1d(256))


def _init_group(rank: int, store: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))


def _teardown() -> None:
    import gc

    import torch.distributed as dist

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------- buffers from one rank

def _buffers_rank(rank: int, store: str, out: str, results: str) -> None:
    import hfai.nn.parallel
    import hfai.reduce

    _init_group(rank, store)
    # The hfreduce DDP: the same parameters on both ranks (broadcast from rank 0) ...
    model = hfai.nn.parallel.DistributedDataParallel(_model(seed=rank),
                                                     reduce_config=hfai.reduce.ReduceConfig(timeout_s=20))
    model.train()
    torch.manual_seed(100 + rank)  # ... but each rank's own batches: BatchNorm statistics differ
    model(torch.randn(16, 8) * (rank + 1)).sum().backward()
    torch.save({k: v for k, v in model.state_dict().items()}, os.path.join(results, f"state{rank}.pt"))
    ckpt.save(out, model, None, others={"epoch": 1})
    # Different parameters: refused on every rank, nothing written over the checkpoint.
    with torch.no_grad():
        model.module[0].weight[0, 0] += rank
    try:
        ckpt.save(out, model, None, others={"epoch": 2})
        refused = "saved"
    except HfaiError as e:
        refused = str(e)
    with open(os.path.join(results, f"rank{rank}"), "w") as f:
        json.dump(refused, f)
    model.close()
    _teardown()


@pytest.mark.slow
def test_buffers_come_from_one_rank_and_differing_parameters_are_refused(tmp_path):
    import hfai.multiprocessing

    out = tmp_path / "latest.pt"
    hfai.multiprocessing.spawn(_buffers_rank, args=(str(tmp_path / "store"), str(out), str(tmp_path)), nprocs=2,
                               bind_numa=False)
    states = [torch.load(tmp_path / f"state{r}.pt") for r in (0, 1)]
    buffers = [k for k in states[0] if "running" in k or "num_batches" in k]
    assert any(not torch.equal(states[0][k], states[1][k]) for k in buffers)  # the ranks did differ
    got = ckpt.load(out)
    for k in buffers:  # every buffer is rank 0's (today's code gave some of rank 1's)
        assert torch.equal(got["model"][k], states[0][k]), k
    assert got["epoch"] == 1 and all(torch.equal(got["model"][k], v) for k, v in states[0].items())
    for r in (0, 1):
        refused = json.loads((tmp_path / f"rank{r}").read_text())
        assert "ranks [1] hold other values than rank 0" in refused and "'module.0.weight'" in refused, refused
    assert ckpt.load(out)["epoch"] == 1  # the refused save left the checkpoint as it was


# ------------------------------------------------------------ init / try_save with a suspend

SUSPEND_AT = 3  # the step after which the platform's flag appears on rank 1's node


def _training_rank(rank: int, store: str, out: str, work: str, suspend: bool) -> None:
    import hfai

    os.environ["HFAI_CONTROL_DIR"] = os.path.join(work, f"control{rank}")
    _init_group(rank, store)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    start_epoch, start_step, best = hfai.checkpoint.init(model, optimizer, scheduler=scheduler, amp_scaler=scaler,
                                                         ckpt_path=out)
    log = open(os.path.join(work, f"log{rank}"), "a")
    log.write(json.dumps({"start": [start_epoch, start_step, best],
                          "state": {k: v.tolist() for k, v in model.state_dict().items()},
                          "lr": scheduler.get_last_lr(), "scale": scaler.get_scale()}) + "\n")
    log.flush()
    for epoch in range(start_epoch, 2):
        for step in range(start_step, 5):
            optimizer.zero_grad()
            x = torch.randn(4, 4, generator=torch.Generator().manual_seed(epoch * 10 + step + rank))
            model(x).square().mean().backward()
            optimizer.step()
            scheduler.step()
            if suspend and rank == 1 and (epoch, step) == (0, SUSPEND_AT):
                open(os.path.join(os.environ["HFAI_CONTROL_DIR"], "suspend"), "w").close()
            log.write(json.dumps({"did": [epoch, step]}) + "\n")
            log.flush()
            if suspend and (epoch, step) == (0, SUSPEND_AT):  # what try_save saves, to compare after resume
                log.write(json.dumps({"saved": {k: v.tolist() for k, v in model.state_dict().items()},
                                      "lr": scheduler.get_last_lr()}) + "\n")
                log.flush()
            model.try_save(epoch, step + 1, others={"best": 0.5})
        start_step = 0
    log.write(json.dumps({"finished": True}) + "\n")
    log.close()
    _teardown()


def _log(work: Path, rank: int) -> list[dict]:
    return [json.loads(line) for line in (work / f"log{rank}").read_text().splitlines()]


@pytest.mark.slow
def test_init_and_try_save_resume_a_suspended_job(tmp_path):
    import hfai.multiprocessing

    out = tmp_path / "latest.pt"
    for r in (0, 1):
        (tmp_path / f"control{r}").mkdir()
    hfai.multiprocessing.spawn(_training_rank, args=(str(tmp_path / "store1"), str(out), str(tmp_path), True),
                               nprocs=2, bind_numa=False)
    for r in (0, 1):
        log = _log(tmp_path, r)
        assert log[0]["start"] == [0, 0, None]
        # Saved and acknowledged right after the step the flag appeared on one node: both ranks.
        assert [e["did"] for e in log if "did" in e][-1] == [0, SUSPEND_AT]
        assert not any("finished" in e for e in log)
        assert (tmp_path / f"control{r}" / "ack").read_text().endswith("exit\n")
    saved = next(e for e in _log(tmp_path, 0) if "saved" in e)
    # The platform resumes the chain: no flag any more, the same command again.
    (tmp_path / "control1" / "suspend").unlink()
    for r in (0, 1):
        (tmp_path / f"control{r}" / "ack").unlink()
        (tmp_path / f"log{r}").unlink()
    hfai.multiprocessing.spawn(_training_rank, args=(str(tmp_path / "store2"), str(out), str(tmp_path), False),
                               nprocs=2, bind_numa=False)
    for r in (0, 1):
        log = _log(tmp_path, r)
        assert log[0]["start"] == [0, SUSPEND_AT + 1, {"best": 0.5}]
        assert log[0]["state"] == saved["saved"] and log[0]["lr"] == saved["lr"] and log[0]["scale"] == 1024.0
        assert [e["did"] for e in log if "did" in e][0] == [0, SUSPEND_AT + 1]
        assert log[-1] == {"finished": True}


def test_init_starts_fresh_and_refuses_what_it_cannot_restore(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert ckpt.init(model, opt, ckpt_path=tmp_path / "latest.pt") == (0, 0, None)
    assert model.try_save(0, 1) is False  # no suspend asked, off the platform
    assert model.try_save(0, 7, others=[1, 2], force=True) is True
    fresh = torch.nn.Linear(2, 2)
    assert ckpt.init(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1), ckpt_path=tmp_path / "latest.pt") == \
        (0, 7, [1, 2])
    assert torch.equal(fresh.weight, model.weight)
    # Another model's shape: a RuntimeError (some scripts catch it to start from scratch), which says where.
    with pytest.raises(RuntimeError, match="cannot resume from .*latest.pt"):
        ckpt.init(torch.nn.Linear(3, 3), None, ckpt_path=tmp_path / "latest.pt")
    ckpt.save({"model": {}}, tmp_path / "other.pt")
    with pytest.raises(ckpt.CheckpointLoadError, match="not a checkpoint of model.try_save"):
        ckpt.init(torch.nn.Linear(2, 2), None, ckpt_path=tmp_path / "other.pt")

    class NoState:
        pass

    with pytest.raises(HfaiError, match="scheduler .*state_dict"):
        ckpt.init(model, opt, scheduler=NoState(), ckpt_path=tmp_path / "latest.pt")
