"""A DataLoader that can resume mid-epoch: ``set_epoch(e)`` and ``set_step(k)``.

Batches are drawn in the main process, by :class:`ResumableBatchSampler` or by the user's
sampler wrapped in :class:`SkippingBatchSampler`, so after an interrupt at batch k of epoch e,
``loader.set_epoch(e)`` (or ``sampler.set_epoch(e)``) then ``loader.set_step(k)`` makes the next
iteration yield exactly the batches the interrupted one had left, without reading the first k.

Importing this module imports torch; ``hfai.data.DataLoader`` loads it lazily.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
import torch.utils.data

from hfai._throughput import mark_step
from hfai.data.batched import BatchCollate, is_batched


class ResumableBatchSampler(torch.utils.data.Sampler):
    """Batches of sample indices for one epoch, reproducible from ``(seed, epoch)``.

    Args:
        n: dataset length.
        batch_size: indices per batch.
        shuffle: permute indices per epoch with a generator seeded by ``(seed, epoch)``.
        drop_last: drop the final short batch.
        num_replicas, rank: data-parallel sharding; every rank permutes identically and takes
            every ``num_replicas``-th index from ``rank`` (the tail that does not divide evenly
            is dropped so all ranks yield the same number of batches).

    ``set_step(k)`` applies to the next iteration only: it starts at batch ``k`` and later
    iterations start at 0 again. ``len()`` counts the batches the next iteration will yield.
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
    ):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas}), got {rank}")
        self.n = n
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Use the permutation of ``epoch`` from the next iteration on."""
        self.epoch = epoch

    def set_step(self, step: int) -> None:
        """Make the next iteration skip its first ``step`` batches (without reading them)."""
        if not 0 <= step <= self.num_batches():
            raise ValueError(f"step must be in [0, {self.num_batches()}], got {step}")
        self._skip = step

    def _order(self) -> np.ndarray:
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        else:
            order = np.arange(self.n)
        per_rank = self.n // self.num_replicas
        return order[self.rank :: self.num_replicas][:per_rank]

    def num_batches(self) -> int:
        """Batches in a whole epoch on this rank."""
        per_rank = self.n // self.num_replicas
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[list[int]]:
        # The epoch and the pending skip are read when the first batch is drawn, not here:
        # torch's multi-process iterator calls iter() twice (in __init__ and in _reset) and
        # only draws from the second, so a skip consumed here would be lost.
        size = self.batch_size
        skip, self._skip = self._skip, 0
        order = self._order()
        for b in range(skip, self.num_batches()):
            mark_step("loader")  # a batch drawn is a step of the scheduler's throughput measure
            yield order[b * size : (b + 1) * size].tolist()

    def __len__(self) -> int:
        return self.num_batches() - self._skip


class SkippingBatchSampler(torch.utils.data.Sampler):
    """Wraps any batch sampler so that an iteration can skip its first ``step`` batches.

    The skipped batches are still drawn from the wrapped sampler (so a shuffling sampler's
    random stream advances exactly as in an uninterrupted run and the remaining batches are
    the same), but no sample of them is read: only index lists are dropped.

    ``once=True``: a step set by :meth:`set_step` applies to the next iteration only (hfai.data's
    contract). ``once=False``: it applies to every iteration until set again (the original
    ffrecord loader's contract). ``len()`` counts the batches the next iteration yields.
    """

    def __init__(self, batches, *, once: bool):
        self.batches = batches
        self.once = once
        self.step = 0

    @property
    def sampler(self):
        """The wrapped batch sampler's sample sampler (as on torch's ``BatchSampler``)."""
        return getattr(self.batches, "sampler", None)

    def set_step(self, step: int) -> None:
        """Skip the first ``step`` batches (see the class docstring for how long it lasts)."""
        if not isinstance(step, (int, np.integer)) or isinstance(step, bool):
            raise TypeError(f"step must be an int, not {type(step).__name__}")
        total = len(self.batches)
        if not 0 <= step <= total:
            raise ValueError(f"step must be in [0, {total}] (the batches in an epoch), got {step}")
        self.step = int(step)

    def __iter__(self) -> Iterator[list[int]]:
        # A generator: the step is read (and, once=True, consumed) at the first draw, not at
        # iter(), which torch's multi-process iterator calls twice (see ResumableBatchSampler).
        skip = self.step
        if self.once:
            self.step = 0
        for batch in itertools.islice(iter(self.batches), skip, None):
            mark_step("loader")  # a step of the scheduler's throughput measure (hfai._throughput)
            yield batch

    def __len__(self) -> int:
        return len(self.batches) - self.step


def check_batched(dataset, batch_size) -> None:
    """Refuse per-sample loading (``batch_size=None``) of a batched dataset: it takes lists."""
    if batch_size is None and is_batched(dataset):
        raise ValueError(
            f"{type(dataset).__name__} is a batched dataset (its __getitem__ takes a list of indices): "
            "give the loader a batch_size (or a batch_sampler)"
        )


def batch_collate(dataset, collate_fn, default):
    """The collate function of a loader over ``dataset``: ``collate_fn``, else ``default``. Over a
    batched dataset it is a :class:`~hfai.data.batched.BatchCollate`: a ``collate_fn`` the user
    gave receives ``__getitem__(indices)``'s return value as it is (as in the original ffrecord
    loader), the default needs one sample per index."""
    if not is_batched(dataset):
        return default if collate_fn is None else collate_fn
    return BatchCollate(default if collate_fn is None else collate_fn, user_given=collate_fn is not None)


class DataLoader(torch.utils.data.DataLoader):
    """A ``torch.utils.data.DataLoader`` that can resume mid-epoch with :meth:`set_step`.

    ``DataLoader(dataset, batch_size=1, shuffle=None, sampler=None, *, seed=0, drop_last=False,
    num_replicas=1, rank=0, generator=None, **kwargs)``; the remaining keyword arguments
    (``num_workers``, ``pin_memory``, ``collate_fn``, ``batch_sampler``,
    ``multiprocessing_context``, ...) go to torch's DataLoader unchanged. The default
    ``collate_fn`` is :func:`hfai.data.dataset.collate` (torch's ``default_collate`` for
    anything but raw uint8 samples).

    Where the batches come from:

    * ``sampler=`` (any torch ``Sampler``, e.g. ``DistributedSampler``), ``batch_sampler=`` or
      ``generator=``: torch's own sampling, exactly as ``torch.utils.data.DataLoader`` with the
      same arguments draws it (``shuffle`` defaults to False with a sampler, True otherwise).
      The user's ``sampler.set_epoch(e)`` takes effect; ``loader.set_epoch(e)`` forwards to it.
      ``seed``, ``num_replicas`` and ``rank`` do not apply (``ValueError``).
    * otherwise: a :class:`ResumableBatchSampler` (``shuffle`` default True), reproducible from
      ``(seed, epoch)`` and sharded by ``num_replicas``/``rank``.

    ``dataset`` may be a batched dataset (:class:`hfai.data.BatchedDataset`, e.g.
    ``ffrecord.torch.Dataset`` or ``hfai.datasets``): each batch is then one call of its
    ``__getitem__(indices)``.

    :meth:`set_step` ``(k)``: the next iteration skips its first ``k`` batches without reading
    them, and later iterations start at 0 again.
    """

    def __init__(
        self,
        dataset,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler=None,
        *,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
        generator: torch.Generator | None = None,
        **kwargs,
    ):
        check_batched(dataset, batch_size if kwargs.get("batch_sampler") is None else 1)
        from hfai.data.dataset import collate

        kwargs["collate_fn"] = batch_collate(dataset, kwargs.get("collate_fn"), collate)
        if sampler is None and generator is None and kwargs.get("batch_sampler") is None:
            if batch_size is None:
                raise ValueError("batch_size=None needs a sampler; hfai.data.DataLoader draws batches")
            self._resumable: ResumableBatchSampler | None = ResumableBatchSampler(
                len(dataset), batch_size, shuffle=True if shuffle is None else shuffle, seed=seed,
                drop_last=drop_last, num_replicas=num_replicas, rank=rank,
            )
            super().__init__(dataset, batch_sampler=self._resumable, **kwargs)
            self._skipping: SkippingBatchSampler | None = None
            return
        if (seed, num_replicas, rank) != (0, 1, 0):
            raise ValueError(
                "seed, num_replicas and rank apply only to hfai.data's own sampling; with a sampler, "
                "batch_sampler or generator, shard and seed through them (e.g. DistributedSampler)"
            )
        self._resumable = None
        if shuffle is None:  # hfai.data shuffles by default; a sampler or batch_sampler decides the order itself
            shuffle = sampler is None and kwargs.get("batch_sampler") is None
        # torch checks the combination (shuffle with a sampler, batch_sampler with batch_size, ...).
        super().__init__(
            dataset, batch_size, shuffle=shuffle, sampler=sampler, drop_last=drop_last, generator=generator, **kwargs
        )
        self._skipping = _wrap(self, once=True)

    def set_epoch(self, epoch: int) -> None:
        """Shuffle the next iteration as epoch ``epoch``: hfai.data's own sampling, or the
        sampler's ``set_epoch`` (``TypeError`` if the sampler has none)."""
        if self._resumable is not None:
            self._resumable.set_epoch(epoch)
            return
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is None:
            raise TypeError(f"this loader's sampler ({type(self.sampler).__name__}) has no set_epoch()")
        set_epoch(epoch)

    def set_step(self, step: int) -> None:
        """Resume: the next iteration skips its first ``step`` batches without reading them."""
        if self._resumable is not None:
            self._resumable.set_step(step)
        else:
            assert self._skipping is not None  # set in __init__ whenever _resumable is not
            self._skipping.set_step(step)


def _wrap(loader: torch.utils.data.DataLoader, *, once: bool) -> SkippingBatchSampler:
    """Replace ``loader``'s batch sampler (built by torch) with a skipping wrapper of it."""
    if loader.batch_sampler is None:
        raise ValueError("a resumable loader needs batches: give it a batch_size")
    wrapper = SkippingBatchSampler(loader.batch_sampler, once=once)
    # torch refuses to set batch_sampler after __init__ (its __setattr__ guard); everything
    # else (loader.sampler, loader.batch_size, generator use) stays as torch built it.
    object.__setattr__(loader, "batch_sampler", wrapper)
    return wrapper
