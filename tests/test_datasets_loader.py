"""dataset.loader() with a DistributedSampler over two real gloo ranks: the ranks share the data,
follow the sampler's set_epoch, and a resumed epoch (set_step) is exactly the tail of an
uninterrupted one, with worker processes and without."""

from __future__ import annotations

import json
import os

import pytest
import torch.multiprocessing as mp

from hfai.datasets.convert_clue import convert_clue_task

N = 23  # examples; each has its own class, so a label names its example


def run_rank(data_dir, sampler_options: dict) -> dict[str, list]:
    """Two epochs, then epoch 1 resumed after 2 batches, then one more pass; labels per batch."""
    from torch.utils.data.distributed import DistributedSampler

    import hfai.datasets as datasets

    datasets.set_data_dir(data_dir)
    ds = datasets.CLUEForCLS("tiny", "train")
    sampler = DistributedSampler(ds, shuffle=True, seed=5, **sampler_options)
    result: dict[str, list] = {}
    for workers in (0, 2):
        loader = ds.loader(3, sampler=sampler, num_workers=workers, pin_memory=False)
        epochs = []
        for epoch in (0, 1):
            sampler.set_epoch(epoch)
            loader.set_step(0)
            epochs.append([batch[2].tolist() for batch in loader])
        sampler.set_epoch(1)
        loader.set_step(2)  # the job was interrupted after 2 batches of epoch 1
        resumed = [batch[2].tolist() for batch in loader]
        again = [batch[2].tolist() for batch in loader]  # the skip applied once
        result[f"workers{workers}"] = [epochs, resumed, again]
    return result


def _rank(rank: int, store: str, data_dir: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        result = run_rank(data_dir, {})  # replicas and rank from the process group
        with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def check_ranks(ranks: list[dict]) -> None:
    for workers in ("workers0", "workers2"):
        per_rank = [r[workers] for r in ranks]
        for epochs, resumed, again in per_rank:
            assert resumed == epochs[1][2:]  # exactly the batches the interrupted epoch had left
            assert again == epochs[1]
            assert epochs[0] != epochs[1]  # set_epoch on the sampler reshuffles
        for epoch in (0, 1):
            seen = [i for epochs, _, _ in per_rank for batch in epochs[epoch] for i in batch]
            # DistributedSampler pads 23 to 24 by repeating one example; each rank gets 12 (4 batches of 3)
            assert len(seen) == 24 and set(seen) == set(range(N))
            assert all(len(epochs[epoch]) == 4 for epochs, _, _ in per_rank)
    assert all(r["workers0"] == r["workers2"] for r in ranks)  # worker processes change nothing


@pytest.fixture
def tiny_task(tmp_path):
    src = tmp_path / "tiny"
    src.mkdir()
    rows = [{"label": str(i), "sentence": "字" * (i % 5 + 1)} for i in range(N)]
    (src / "train.json").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    convert_clue_task(src, tmp_path / "datasets", max_length=8)
    return tmp_path / "datasets"


def test_distributed_sampler_two_replicas_resume_exactly(tiny_task):
    check_ranks([run_rank(tiny_task, {"num_replicas": 2, "rank": r}) for r in (0, 1)])


@pytest.mark.slow  # two spawned interpreters importing torch: ~10-15 s on 2 cores
def test_distributed_sampler_two_gloo_ranks_resume_exactly(tiny_task, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(tiny_task), str(out)), nprocs=2)
    check_ranks([json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)])
