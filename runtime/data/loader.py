"""A DataLoader that can resume mid-epoch: ``set_epoch(e)`` and ``set_step(k)``.

Batches are drawn by :class:`ResumableBatchSampler` in the main process, so after an interrupt
at batch k of epoch e, ``loader.set_epoch(e); loader.set_step(k)`` makes the next iteration
yield exactly the batches the interrupted one had left, without reading the first k.

Importing this module imports torch; ``hfai.data.DataLoader`` loads it lazily.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch.utils.data


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
            yield order[b * size : (b + 1) * size].tolist()

    def __len__(self) -> int:
        return self.num_batches() - self._skip


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` driven by a :class:`ResumableBatchSampler`.

    ``DataLoader(dataset, batch_size, shuffle=True, seed=0, drop_last=False, num_replicas=1,
    rank=0, **kwargs)``; the remaining keyword arguments (``num_workers``, ``pin_memory``,
    ``collate_fn``, ``multiprocessing_context``, ...) go to torch's DataLoader unchanged. The
    default ``collate_fn`` is :func:`hfai.data.dataset.collate`.
    """

    def __init__(
        self,
        dataset,
        batch_size: int = 1,
        *,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        num_replicas: int = 1,
        rank: int = 0,
        **kwargs,
    ):
        sampler = ResumableBatchSampler(
            len(dataset), batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last,
            num_replicas=num_replicas, rank=rank,
        )
        if "collate_fn" not in kwargs:
            from hfai.data.dataset import collate

            kwargs["collate_fn"] = collate
        super().__init__(dataset, batch_sampler=sampler, **kwargs)
        # batch_sampler as its own type (torch fixes batch_sampler once the loader is built).
        self._resumable = sampler

    def set_epoch(self, epoch: int) -> None:
        """Shuffle the next iteration with the permutation of ``epoch``."""
        self._resumable.set_epoch(epoch)

    def set_step(self, step: int) -> None:
        """Resume: the next iteration skips its first ``step`` batches without reading them."""
        self._resumable.set_step(step)
