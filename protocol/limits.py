"""The bounds of the numbers a user types (node counts, ranks, array indices, retries).

The CLI refuses a number outside them before it sends anything, with one line naming the option;
the controller refuses it from any client. They lie far above any real cluster and far below what
the wire carries (msgpack's integers are 64-bit: a bigger one cannot even be sent) or what the
policy's arithmetic and memory could take.
"""

from __future__ import annotations

__all__ = ["MAX_ARRAY", "MAX_ARRAY_INDEX", "MAX_HANG_RESTARTS", "MAX_NODES", "MAX_RANK", "MAX_RETRIES"]

#: Nodes a job may ask for (also a quota's largest value).
MAX_NODES = 100_000
#: A rank of a job: 0 .. MAX_NODES - 1.
MAX_RANK = MAX_NODES - 1
#: Members of one job array.
MAX_ARRAY = 1000
#: The largest index a job array's member may have (HFAI_ARRAY_INDEX).
MAX_ARRAY_INDEX = 999_999
#: Retries of a failed run (--retry).
MAX_RETRIES = 100
#: Restarts of a run ended as hung (--restart-on-hang).
MAX_HANG_RESTARTS = 100
