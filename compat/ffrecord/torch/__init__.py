"""``ffrecord.torch``: the torch side of HFAiLab's ffrecord, served by :mod:`hfai.data`.

``Dataset`` (batched: ``dataset[indices]`` returns a list), ``Subset``, ``ConcatDataset``,
``ReaderRegistry`` and ``DataLoader`` (torch's, plus ``set_step``). Imports torch.
"""

from ffrecord.torch.dataloader import DataLoader
from ffrecord.torch.dataset import ConcatDataset, Dataset, ReaderRegistry, Subset

__all__ = ["ConcatDataset", "DataLoader", "Dataset", "ReaderRegistry", "Subset"]
