"""``haiscale.ddp.DistributedDataParallel``: the platform's hfreduce DDP under haiscale's name.

It is :class:`hfai.reduce.DistributedDataParallel` (torch DDP's constructor and ``no_sync()``,
gradients averaged over ``process_group`` by CPU cores in shared memory; see docs/reduce.md),
plus the one attribute haiscale scripts reach for: ``ddp.reducer.stop()`` before they exit.
"""

from __future__ import annotations

from hfai.reduce.ddp import DistributedDataParallel as _HfreduceDDP

__all__ = ["DistributedDataParallel"]


class _ReducerHandle:
    """What ``ddp.reducer`` gives: ``stop()`` releases the wrapper's communication thread and arena."""

    def __init__(self, ddp: _HfreduceDDP) -> None:
        self._ddp = ddp

    def stop(self) -> None:
        """Idempotent. After it, a backward no longer reduces; call it once training is over."""
        self._ddp.close()


class DistributedDataParallel(_HfreduceDDP):
    """hfreduce data parallelism with haiscale's interface.

    Construction is collective over ``process_group`` (default: the world), as with torch's DDP.
    ``device_ids``, ``output_device``, ``dim``, ``check_reduction`` and ``static_graph`` are
    accepted and have no effect: the module runs on the device it is on.
    """

    @property
    def reducer(self) -> _ReducerHandle:
        return _ReducerHandle(self)
