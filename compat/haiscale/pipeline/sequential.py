"""``SequentialModel`` and ``partition``: a model as an ordered list of layers, cut into stages."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from torch import nn

from haiscale.pipeline.errors import PartitionError


class SequentialModel(nn.Sequential):
    """``nn.Sequential`` whose layers may take and return several tensors.

    A layer that returns a tuple has it unpacked into the next layer's positional arguments; any
    other return value is passed as the single argument. The model returns what its last layer
    returned.
    """

    def forward(self, *inputs):
        out = inputs if len(inputs) != 1 else inputs[0]
        args: tuple = inputs
        for layer in self:
            out = layer(*args)
            args = out if isinstance(out, tuple) else (out,)
        return out


def _even_balance(nlayers: int, nparts: int) -> list[int]:
    base, extra = divmod(nlayers, nparts)
    # Earlier parts take the extra layers, as in the balances hfai scripts write by hand
    # ([4, 4, 4, 3, 3, 3, 3, 2]): the last stage also computes the loss.
    return [base + (1 if i < extra else 0) for i in range(nparts)]


def _check_balance(balance: Sequence[int], nlayers: int, nparts: int) -> list[int]:
    sizes = [int(b) for b in balance]
    if len(sizes) != nparts:
        raise PartitionError(
            f"balance has {len(sizes)} entries but the model is cut into {nparts} parts "
            "(nranks * num_model_chunks); give one layer count per part"
        )
    if any(b < 1 for b in sizes):
        raise PartitionError(f"balance {sizes}: every part needs at least one layer")
    if sum(sizes) != nlayers:
        raise PartitionError(f"balance {sizes} sums to {sum(sizes)}, but the model has {nlayers} layers")
    return sizes


def partition(
    module: nn.Sequential,
    rank: int,
    nranks: int,
    balance: Sequence[int] | None = None,
    num_model_chunks: int = 1,
) -> SequentialModel | list[SequentialModel]:
    """This rank's layers of ``module`` (an ``nn.Sequential``, e.g. a :class:`SequentialModel`).

    The layers are cut, in order, into ``nranks * num_model_chunks`` consecutive parts of
    ``balance[i]`` layers each (default: as even as possible, earlier parts one layer more).
    With ``num_model_chunks == 1`` the result is part ``rank``; otherwise a list of parts
    ``rank, rank + nranks, rank + 2 * nranks, ...`` (the interleaved layout
    :class:`Interleaved1F1B` expects). Layers keep their names, so a part's ``state_dict`` keys
    are the whole model's keys for those layers.
    """
    if not isinstance(module, nn.Sequential):
        raise PartitionError(
            f"partition() cuts an nn.Sequential or haiscale.pipeline.SequentialModel, got {type(module).__name__}"
        )
    if nranks < 1 or not 0 <= rank < nranks:
        raise PartitionError(f"rank {rank} is not in range(nranks={nranks})")
    if num_model_chunks < 1:
        raise PartitionError(f"num_model_chunks must be >= 1, got {num_model_chunks}")
    items = list(module._modules.items())
    nparts = nranks * num_model_chunks
    if len(items) < nparts:
        raise PartitionError(f"the model has {len(items)} layers, fewer than the {nparts} parts asked for")
    sizes = _even_balance(len(items), nparts) if balance is None else _check_balance(balance, len(items), nparts)
    starts = [sum(sizes[:i]) for i in range(nparts)]
    parts = [SequentialModel(OrderedDict(items[starts[i] : starts[i] + sizes[i]])) for i in range(rank, nparts, nranks)]
    return parts[0] if num_model_chunks == 1 else parts
