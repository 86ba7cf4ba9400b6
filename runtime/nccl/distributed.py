"""``hfai.nccl.distributed``: the original client's name for :mod:`hfai.distributed`.

Importing it replaces this module in ``sys.modules`` with :mod:`hfai.distributed` itself, so
``import hfai.nccl.distributed as dist`` hands out that module (the import system reads the
module back from ``sys.modules`` after running this file).
"""

import sys

from hfai import distributed as _distributed

sys.modules[__name__] = _distributed
