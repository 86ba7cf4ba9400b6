"""``hfai.nn.parallel.DistributedDataParallel``: the hfreduce DDP, re-exported from hfai.reduce."""

from hfai.reduce.ddp import DistributedDataParallel

__all__ = ["DistributedDataParallel"]
