"""A batched dataset's ``__getitem__(indices)`` result goes to a user's ``collate_fn`` as it is.

HFAiLab/yolov5 (utils/dataloaders_hfai.py) returns ``(imgs, labels, shapes)`` -- three lists --
from ``__getitem__(indices)`` and unpacks that tuple in its own ``collate_fn``; the original
ffrecord loader hands the dataset's return value to ``collate_fn`` unchanged. Only the default
collate needs one sample per index, and there a mismatch is an error, not a wrong batch.
"""

from __future__ import annotations

import pickle

import pytest

torch = pytest.importorskip("torch")

import ffrecord.torch  # noqa: E402
from ffrecord import FileReader, FileWriter  # noqa: E402
from torch.utils.data import DistributedSampler  # noqa: E402

import hfai.data  # noqa: E402

N = 10


@pytest.fixture(scope="module")
def ffr(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("collate") / "train2017.ffr"
    with FileWriter(path, N) as w:
        for i in range(N):
            w.write_one(pickle.dumps(i))
    return str(path)


class Columns(ffrecord.torch.Dataset):
    """yolov5's shape: one call returns three parallel lists, not a list of samples."""

    def __init__(self, path):
        self.reader = FileReader(path, True)

    def __len__(self):
        return self.reader.n

    def __getitem__(self, indices):
        values = [pickle.loads(b) for b in self.reader.read(indices)]
        return values, [torch.full((1, 2), float(v)) for v in values], [(4, 4)] * len(values)

    @staticmethod
    def collate_fn(batch):
        values, labels, shapes = batch
        for i, lb in enumerate(labels):
            lb[:, 0] = i  # yolov5 writes the position in the batch into each label
        return torch.tensor(values), torch.cat(labels, 0), shapes


def _values(loader) -> list[list[int]]:
    out = []
    for values, labels, shapes in loader:
        assert labels[:, 1].tolist() == [float(v) for v in values.tolist()]
        assert labels[:, 0].tolist() == list(range(len(values)))
        assert len(shapes) == len(values)
        out.append(values.tolist())
    return out


@pytest.mark.parametrize("num_workers", [0, 2])
def test_ffrecord_loader_hands_the_return_value_to_collate_fn(ffr, num_workers):
    ds = Columns(ffr)
    loader = ffrecord.torch.DataLoader(ds, batch_size=4, num_workers=num_workers, collate_fn=Columns.collate_fn)
    assert _values(loader) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_ffrecord_loader_with_sampler_and_generator_as_yolov5_calls_it(ffr):
    ds = Columns(ffr)
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=3)
    g = torch.Generator()
    g.manual_seed(6148914691236517205)
    loader = ffrecord.torch.DataLoader(
        ds, batch_size=2, shuffle=False, num_workers=0, sampler=sampler, pin_memory=False,
        collate_fn=Columns.collate_fn, worker_init_fn=lambda worker_id: None, generator=g,
    )
    want = list(sampler)
    assert [v for batch in _values(loader) for v in batch] == want
    loader.set_step(1)
    assert [v for batch in _values(loader) for v in batch] == want[2:]


def test_hfai_loader_hands_the_return_value_to_collate_fn(ffr):
    loader = hfai.data.DataLoader(Columns(ffr), 3, shuffle=False, collate_fn=Columns.collate_fn)
    assert _values(loader) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]


@pytest.mark.parametrize("make", [
    lambda ds: ffrecord.torch.DataLoader(ds, batch_size=4),
    lambda ds: hfai.data.DataLoader(ds, 4, shuffle=False),
])
def test_default_collate_still_refuses_a_result_that_is_not_one_sample_per_index(ffr, make):
    with pytest.raises(ValueError, match="returned 3 samples for 4 indices.*collate_fn"):
        next(iter(make(Columns(ffr))))


def test_one_sample_per_index_is_collated_as_before(ffr):
    class Pairs(Columns):
        def __getitem__(self, indices):
            return [(pickle.loads(b), 1) for b in self.reader.read(indices)]

    first, ones = next(iter(ffrecord.torch.DataLoader(Pairs(ffr), batch_size=4)))
    assert first.tolist() == [0, 1, 2, 3] and ones.tolist() == [1, 1, 1, 1]


def test_stock_torch_loader_says_what_went_wrong(ffr):
    def unpack(batch):
        values, labels, shapes = batch
        return values

    for collate_fn in (None, unpack):
        loader = torch.utils.data.DataLoader(Columns(ffr), batch_size=4, collate_fn=collate_fn)
        with pytest.raises(ValueError, match="returned 3 samples for 4 indices.*ffrecord.torch.DataLoader"):
            next(iter(loader))
