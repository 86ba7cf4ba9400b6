"""The exception tree of ``hfai.reduce``.

Every error this package raises on purpose derives from :class:`ReduceError`, so callers can catch
one type. After a :class:`PeerError` or :class:`SizeMismatchError` the group that raised it is
aborted: every later call on it raises :class:`GroupAbortedError`; build a new group (in practice:
restart the job) to continue.
"""

from __future__ import annotations


class ReduceError(Exception):
    """Base class of all errors raised by ``hfai.reduce``."""


class NotInitializedError(ReduceError):
    """``torch.distributed`` is not initialised, or no default reduce group exists yet."""


class UnsupportedTensorError(ReduceError, TypeError):
    """The tensor's dtype, layout or device cannot be reduced (see ``SUPPORTED_DTYPES``)."""


class UnsupportedPlatformError(ReduceError):
    """Several ranks of one node on a CPU whose memory order the shared-memory barrier does not
    rely on safely (anything but x86-64); use ``torch.distributed`` there."""


class SizeMismatchError(ReduceError, ValueError):
    """Ranks called the same collective with different sizes, dtypes or ops.

    Raised on every rank of the node (and, across nodes, on the leaders; their local ranks then
    raise :class:`GroupAbortedError`).
    """


class CapacityError(ReduceError, ValueError):
    """A shared buffer request does not fit in the group's per-rank slot."""


class GroupAbortedError(ReduceError):
    """The group was aborted earlier (by this rank or a peer) and can no longer be used."""


class GroupClosedError(ReduceError):
    """The group was closed with ``close()``."""


class PeerError(ReduceError):
    """A peer rank failed to take part in a collective."""


class PeerTimeoutError(PeerError, TimeoutError):
    """Peers did not arrive within the group's timeout (they may be hung or much slower)."""


class PeerDiedError(PeerError):
    """A peer process on this node exited while the others waited for it."""


class InterNodeError(PeerError):
    """The inter-node all-reduce between node leaders failed (another node died or timed out)."""
