"""torch integration: batched __getitems__ with the stock DataLoader, and resumable loading."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hfai.data import DataLoader, Dataset, FileWriter  # noqa: E402
from hfai.data.loader import ResumableBatchSampler  # noqa: E402

N, WIDTH = 40, 8


@pytest.fixture(scope="module")
def ffr(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("torch") / "t.ffr"
    with FileWriter(path, N) as w:
        for i in range(N):
            w.write_one(np.full(WIDTH, i, dtype=np.uint8))
    return str(path)


class CountingDataset(Dataset):
    """Records every batch of indices it is asked for (in this process)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[list[int]] = []

    def __getitems__(self, indices):
        self.batches.append(list(indices))
        return super().__getitems__(indices)


def first_bytes(batch) -> list[int]:
    return batch[:, 0].tolist()


@pytest.mark.parametrize(
    ("workers", "context"), [(0, None), (2, "fork"), (2, "spawn")], ids=["inline", "fork", "spawn"]
)
@pytest.mark.slow
def test_stock_dataloader_reads_whole_batches(ffr, workers, context):
    ds = Dataset(ffr)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=6, shuffle=False, num_workers=workers, multiprocessing_context=context
    )
    batches = list(loader)
    assert [b.shape for b in batches] == [(6, WIDTH)] * 6 + [(4, WIDTH)]
    assert batches[0].dtype == torch.uint8
    assert sum((first_bytes(b) for b in batches), []) == list(range(N))


def test_getitems_is_one_call_per_batch_and_handles_repeats(ffr):
    ds = CountingDataset(ffr)
    loader = torch.utils.data.DataLoader(ds, batch_sampler=[[3, 3, 0], [5]], num_workers=0)
    assert [first_bytes(b) for b in loader] == [[3, 3, 0], [5]]
    assert ds.batches == [[3, 3, 0], [5]]


def test_fast_collate_matches_default_collate():
    from hfai.data.dataset import collate

    same = [np.arange(i, i + 5, dtype=np.uint8) for i in range(3)]
    assert torch.equal(collate(same), torch.utils.data.default_collate(same))
    assert collate([1, 2]).tolist() == [1, 2]  # anything else: default_collate
    with pytest.raises(RuntimeError):  # unequal lengths cannot be stacked, as with default_collate
        collate([np.zeros(2, np.uint8), np.zeros(3, np.uint8)])


def test_collate_uses_the_batch_buffer_only_while_the_batch_is_intact(ffr):
    from hfai.data.dataset import collate

    class Reversing(Dataset):
        def process(self, indices, samples):
            samples.reverse()  # in place: the list no longer matches its buffer's order
            return samples

    plain = collate(Dataset(ffr).__getitems__([1, 2, 3]))
    assert first_bytes(plain) == [1, 2, 3]
    assert first_bytes(collate(Reversing(ffr).__getitems__([1, 2, 3]))) == [3, 2, 1]


def test_transform_and_getitem(ffr):
    ds = Dataset(ffr, transform=lambda a: int(a.sum()))
    assert ds[3] == 3 * WIDTH and ds.__getitems__([1, 2]) == [WIDTH, 2 * WIDTH]
    with pytest.raises(IndexError):
        ds[-1]


def test_set_step_resumes_mid_epoch_without_reading_skipped_batches(ffr):
    ds = CountingDataset(ffr)
    loader = ds.loader(5, shuffle=True, seed=7)
    loader.set_epoch(3)
    full = [first_bytes(b) for b in loader]
    assert sorted(sum(full, [])) == list(range(N)) and len(full) == 8

    ds.batches.clear()
    loader.set_epoch(3)
    loader.set_step(3)
    assert len(loader) == 5
    resumed = [first_bytes(b) for b in loader]
    assert resumed == full[3:]
    assert ds.batches == full[3:]  # the first 3 batches were never read
    assert [first_bytes(b) for b in loader] == full  # set_step is one-shot


def test_set_step_with_worker_processes(ffr):
    loader = DataLoader(Dataset(ffr), 5, seed=1, num_workers=2, multiprocessing_context="fork")
    full = [first_bytes(b) for b in loader]
    loader.set_step(6)
    assert [first_bytes(b) for b in loader] == full[6:]


def test_epochs_shuffle_differently_and_reproducibly():
    a, b = ResumableBatchSampler(N, 4, seed=0), ResumableBatchSampler(N, 4, seed=0)
    a.set_epoch(1)
    b.set_epoch(1)
    assert list(a) == list(b)
    b.set_epoch(2)
    assert list(a) != list(b)


def test_sharding_splits_an_epoch_between_ranks():
    shards = [list(ResumableBatchSampler(41, 4, seed=5, num_replicas=2, rank=r)) for r in (0, 1)]
    flat = [sum(s, []) for s in shards]
    assert len(flat[0]) == len(flat[1]) == 20 and not set(flat[0]) & set(flat[1])


def test_set_step_rejects_steps_outside_the_epoch():
    s = ResumableBatchSampler(10, 3, drop_last=True)
    with pytest.raises(ValueError):
        s.set_step(4)
    s.set_step(3)
    assert list(s) == []


def test_importing_hfai_data_and_its_cli_does_not_import_torch():
    code = "import sys, hfai, hfai.data, hfai.cli.data; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
    cli_only = "import sys, hfai.cli.data; assert 'numpy' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", cli_only], check=True)


class Squares(torch.utils.data.Dataset):
    """A plain per-index torch dataset that records what it reads."""

    def __init__(self, n):
        self.n = n
        self.read = []

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.read.append(i)
        return i


def test_loader_follows_a_distributed_sampler_and_skips_without_reading():
    sampler = torch.utils.data.DistributedSampler(range(30), num_replicas=2, rank=1, shuffle=True, seed=4)
    sampler.set_epoch(2)
    order = list(sampler)
    ds = Squares(30)
    loader = DataLoader(ds, 4, sampler=sampler)
    loader.set_epoch(2)  # forwarded to the sampler
    loader.set_step(2)
    assert len(loader) == 2
    assert [b.tolist() for b in loader] == [order[8:12], order[12:15]]
    assert ds.read == order[8:]  # the first two batches were never read
    assert len(loader) == 4  # the skip applied once
    sampler.set_epoch(3)
    assert sum((b.tolist() for b in loader), []) == list(sampler) != order


def test_loader_with_a_generator_or_batch_sampler_draws_as_torch():
    ref = torch.utils.data.DataLoader(range(20), batch_size=6, shuffle=True, generator=torch.Generator().manual_seed(9))
    loader = DataLoader(Squares(20), 6, generator=torch.Generator().manual_seed(9))
    assert [b.tolist() for b in loader] == [b.tolist() for b in ref]
    batches = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(7)), 3, drop_last=False)
    loader = DataLoader(Squares(7), batch_sampler=batches)
    loader.set_step(1)
    assert [b.tolist() for b in loader] == [[3, 4, 5], [6]]


def test_loader_refuses_what_does_not_apply_to_a_sampler():
    sampler = torch.utils.data.SequentialSampler(range(5))
    with pytest.raises(ValueError, match="shard and seed"):
        DataLoader(Squares(5), 2, sampler=sampler, num_replicas=2)
    with pytest.raises(ValueError, match="mutually exclusive"):  # torch's own check
        DataLoader(Squares(5), 2, sampler=sampler, shuffle=True)
    with pytest.raises(TypeError, match="no set_epoch"):
        DataLoader(Squares(5), 2, sampler=sampler).set_epoch(1)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        DataLoader(Squares(5), 2, sampler=sampler).set_step(4)


def test_batched_dataset_gets_lists_from_every_loader():
    from hfai.data import BatchedDataset

    class Tens(BatchedDataset):
        def __init__(self):  # no super().__init__()
            self.calls = []

        def __len__(self):
            return 7

        def __getitem__(self, indices):
            self.calls.append(indices)
            return [10 * i for i in indices]

    for make in (DataLoader, torch.utils.data.DataLoader):
        ds = Tens()
        assert [b.tolist() for b in make(ds, 3, shuffle=False)] == [[0, 10, 20], [30, 40, 50], [60]]
        assert ds.calls == [[0, 1, 2], [3, 4, 5], [6]]
    with pytest.raises(ValueError, match="batched dataset"):
        DataLoader(Tens(), None, sampler=torch.utils.data.SequentialSampler(range(7)))


def test_a_subclass_getitem_is_honoured_and_lists_read_batches(ffr):
    class Decoded(Dataset):
        def __getitem__(self, index):
            return int(super().__getitem__(index)[0]) + 100

    assert next(iter(DataLoader(Decoded(ffr), 3, shuffle=False))).tolist() == [100, 101, 102]
    assert [int(s[0]) for s in Dataset(ffr)[[4, 4, 1]]] == [4, 4, 1]
