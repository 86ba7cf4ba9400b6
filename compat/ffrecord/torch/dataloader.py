"""``ffrecord.torch.DataLoader``: torch's DataLoader with ``set_step`` and batched datasets.

It takes the original's arguments (``shuffle=False`` by default, ``skippable=True``) and draws
batches exactly as ``torch.utils.data.DataLoader`` with the same arguments (same sampler, same
``generator``), so a run gives the batches the original gives. Worker processes are forked, as
in the original (the readers are fork-safe), unless ``multiprocessing_context`` says otherwise.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils.data

from hfai.data.batched import is_batched
from hfai.data.loader import SkippingBatchSampler, _wrap, batch_collate, check_batched


class DataLoader(torch.utils.data.DataLoader):
    """``torch.utils.data.DataLoader`` whose iterations can skip their first batches.

    Arguments as torch's (and the original's): ``dataset, batch_size=1, shuffle=False,
    sampler=None, batch_sampler=None, num_workers=0, collate_fn=None, pin_memory=False,
    drop_last=False, timeout=0, worker_init_fn=None, generator=None, *, prefetch_factor=2,
    persistent_workers=False, skippable=True``; other torch keywords pass through.

    A batched dataset (``ffrecord.torch.Dataset``, any :class:`hfai.data.BatchedDataset`) gets
    each batch of indices in one ``__getitem__`` call; a plain torch dataset is read per index.

    :meth:`set_step` ``(k)`` makes every following iteration skip its first ``k`` batches
    without reading them, until ``set_step`` is called again (the original's contract: a
    resumed epoch calls ``set_step(start_step)`` and the next epoch ``set_step(0)``). With
    ``skippable=False`` the batch sampler is torch's own and ``set_step`` raises.
    """

    def __init__(
        self,
        dataset,
        batch_size: int | None = 1,
        shuffle: bool = False,
        sampler=None,
        batch_sampler=None,
        num_workers: int = 0,
        collate_fn=None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn=None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = 2,
        persistent_workers: bool = False,
        skippable: bool = True,
        multiprocessing_context: Any = None,
        **kwargs,
    ):
        check_batched(dataset, batch_size if batch_sampler is None else 1)
        # torch's own default (default_collate), as the original's; over a batched dataset a
        # collate_fn given here receives what __getitem__(indices) returns, as it is.
        default = torch.utils.data.default_collate if is_batched(dataset) else None
        collate_fn = batch_collate(dataset, collate_fn, default)
        if num_workers > 0 and multiprocessing_context is None:
            multiprocessing_context = "fork"
        super().__init__(
            dataset, batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            num_workers=num_workers, collate_fn=collate_fn, pin_memory=pin_memory, drop_last=drop_last,
            timeout=timeout, worker_init_fn=worker_init_fn, multiprocessing_context=multiprocessing_context,
            generator=generator, prefetch_factor=prefetch_factor if num_workers > 0 else None,
            persistent_workers=persistent_workers, **kwargs,
        )
        self.skippable = skippable
        self._skipping: SkippingBatchSampler | None = _wrap(self, once=False) if skippable else None

    def set_step(self, step: int) -> None:
        """Skip the first ``step`` batches of every following iteration (until set again)."""
        if self._skipping is None:
            raise TypeError("this DataLoader was created with skippable=False: set_step() is not available")
        self._skipping.set_step(step)
