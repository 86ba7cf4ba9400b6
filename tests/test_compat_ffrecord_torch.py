"""Batched datasets and the loaders that follow a sampler and resume (issue 21 §4):
ffrecord.torch (Dataset, Subset, ConcatDataset, ReaderRegistry, DataLoader) and
hfai.data.DataLoader(sampler=...)."""

from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")

from ffrecord import FileReader, FileWriter  # noqa: E402
from ffrecord.torch import ConcatDataset, DataLoader, Dataset, ReaderRegistry, Subset  # noqa: E402

import hfai.data  # noqa: E402

N = 24


@pytest.fixture(scope="module")
def ffr(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fft") / "t.ffr"
    with FileWriter(path, N) as w:
        for i in range(N):
            w.write_one(pickle.dumps((i, 10 * i)))
    return str(path)


class Pickled(Dataset):
    """The original's usual subclass: the base opens the reader, process() decodes a batch."""

    def process(self, indices, data):
        return [pickle.loads(b) for b in data]


class Own(Dataset):
    """A subclass with its own __init__ (no super().__init__()) and its own batched __getitem__."""

    def __init__(self, n):
        self.n = n  # the name the old base class read for its own batched path
        self.calls = []

    def __len__(self):
        return self.n

    def __getitem__(self, indices):
        self.calls.append(list(indices))
        return [(i, 10 * i) for i in indices]


def firsts(loader) -> list[list[int]]:
    return [b[0].tolist() for b in loader]


def test_a_subclass_getitem_is_what_the_loaders_call():
    for make in (DataLoader, hfai.data.DataLoader, torch.utils.data.DataLoader):
        ds = Own(10)
        loader = make(ds, batch_size=4, shuffle=False)
        assert firsts(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], make
        assert ds.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # one call per batch, with lists
    assert Own(3)[[2]] == [(2, 20)]


def test_the_base_dataset_reads_a_batch_and_process_decodes_it(ffr):
    ds = Pickled(ffr)
    assert len(ds) == N and ds[[5, 1, 5]] == [(5, 50), (1, 10), (5, 50)]
    assert ds.fnames == ffr and ds.ffreaders() == [ds.reader]
    with pytest.raises(TypeError, match="list of indices"):
        ds[3]
    with pytest.raises(NotImplementedError, match="process"):
        Dataset(ffr)[[0]]


def test_subset_and_concat_keep_repeats_and_order(ffr):
    a, b = Pickled(ffr), Own(5)
    cat = ConcatDataset([a, b])
    assert len(cat) == N + 5 and len(a + b) == N + 5
    # Repeated indices in one batch, from both datasets, in any order (the original gave 0s).
    assert cat[[N + 1, 3, N + 1, 3, -1]] == [(1, 10), (3, 30), (1, 10), (3, 30), (4, 40)]
    with pytest.raises(IndexError):
        cat[[N + 5]]
    sub = Subset(a, [7, 7, 2])
    assert len(sub) == 3 and sub[[2, 0, 1]] == [(2, 20), (7, 70), (7, 70)]
    assert firsts(DataLoader(cat, 10)) == [list(range(10)), list(range(10, 20)), [20, 21, 22, 23, 0, 1, 2, 3, 4]]


def test_reader_registry_finds_readers_and_nested_registries(ffr):
    class Holder(ReaderRegistry):
        def __init__(self):
            self.r1 = FileReader(ffr)
            self.r2 = FileReader(ffr)

    class Both(Dataset):
        def __init__(self):
            self.reader1 = FileReader(ffr)
            self.other = Holder()
            self.reader2 = FileReader(ffr)

    ds = Both()
    assert ds.ffreaders() == [ds.reader1, ds.reader2, ds.other.r1, ds.other.r2]


@pytest.mark.parametrize("workers", [0, 2], ids=["inline", "forked"])
def test_generator_gives_torchs_batches_and_set_step_skips_them(ffr, workers):
    ref = torch.utils.data.DataLoader(
        [(i, 10 * i) for i in range(N)], batch_size=5, shuffle=True, generator=torch.Generator().manual_seed(7)
    )
    expected = firsts(ref) + firsts(ref)  # two epochs of the same generator
    loader = DataLoader(Pickled(ffr), 5, shuffle=True, generator=torch.Generator().manual_seed(7), num_workers=workers)
    loader.set_step(2)
    assert len(loader) == 3
    # The skip lasts until set again (the original's contract), the permutations go on as torch's.
    assert firsts(loader) == expected[2:5]
    assert firsts(loader) == expected[7:10]
    loader.set_step(0)
    assert len(loader) == 5


def test_ffrecord_loader_defaults_to_no_shuffle_and_rejects_bad_steps(ffr):
    loader = DataLoader(Pickled(ffr), 10)
    assert firsts(loader) == [list(range(10)), list(range(10, 20)), list(range(20, 24))]
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        loader.set_step(4)
    with pytest.raises(ValueError):
        loader.set_step(-1)
    with pytest.raises(TypeError, match="skippable=False"):
        DataLoader(Pickled(ffr), 10, skippable=False).set_step(1)
    with pytest.raises(ValueError, match="batched dataset"):
        DataLoader(Pickled(ffr), None)


@pytest.mark.parametrize("make", [DataLoader, hfai.data.DataLoader], ids=["ffrecord", "hfai.data"])
def test_loaders_follow_a_distributed_sampler_and_its_epochs(ffr, make):
    def run(rank, epoch, step):
        sampler = torch.utils.data.DistributedSampler(range(N), num_replicas=2, rank=rank, shuffle=True, seed=3)
        ds = Own(N)
        loader = make(ds, 4, sampler=sampler)
        sampler.set_epoch(epoch)
        loader.set_step(step)
        return firsts(loader), ds.calls

    for rank in (0, 1):
        sampler = torch.utils.data.DistributedSampler(range(N), num_replicas=2, rank=rank, shuffle=True, seed=3)
        sampler.set_epoch(5)
        order = list(sampler)
        whole = [order[k : k + 4] for k in range(0, len(order), 4)]
        batches, calls = run(rank, 5, 2)
        assert batches == whole[2:] and calls == whole[2:]  # the skipped batches were never read
    assert run(0, 5, 0)[0] != run(0, 6, 0)[0]
