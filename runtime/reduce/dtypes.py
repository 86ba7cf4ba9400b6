"""Which dtypes can be reduced, and in which dtype they are summed."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
import torch

from hfai.reduce.errors import UnsupportedTensorError


class ReduceOp(enum.Enum):
    """``SUM`` adds; ``AVG`` adds and divides by the number of ranks (in the summing dtype)."""

    SUM = 1
    AVG = 2


@dataclass(frozen=True)
class DTypeRule:
    code: int  # exchanged between ranks to detect disagreement
    acc: torch.dtype  # the dtype the shared buffers hold and sums are formed in

    @property
    def acc_np(self) -> np.dtype:
        return np.dtype(np.float64 if self.acc == torch.float64 else np.float32)

    @property
    def itemsize(self) -> int:
        return self.acc_np.itemsize


#: fp16 and bf16 are summed in fp32 (no overflow or precision loss from summing in half).
SUPPORTED_DTYPES: dict[torch.dtype, DTypeRule] = {
    torch.float32: DTypeRule(1, torch.float32),
    torch.float16: DTypeRule(2, torch.float32),
    torch.bfloat16: DTypeRule(3, torch.float32),
    torch.float64: DTypeRule(4, torch.float64),
}


def rule_for(dtype: torch.dtype) -> DTypeRule:
    try:
        return SUPPORTED_DTYPES[dtype]
    except KeyError:
        names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
        raise UnsupportedTensorError(
            f"cannot reduce dtype {dtype}; supported dtypes are {names}"
        ) from None
