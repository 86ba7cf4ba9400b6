"""One small error tree for the whole platform.

Every error a user can cause derives from :class:`HfaiError` and carries a message that says what
went wrong and what to do; the CLI prints it without a traceback. ``code`` travels in
``ErrorReply`` so a client can re-raise the same class on its side.
"""

from __future__ import annotations


class HfaiError(Exception):
    """Base of every error hfai raises on purpose."""

    code = "error"


class ProtocolError(HfaiError):
    """Bytes that are not a valid hfai message: garbage, unknown kind, missing field, newer major."""

    code = "protocol"


class InvalidRequest(HfaiError):
    """A request that is well-formed but makes no sense (0 nodes, unknown priority, ...)."""

    code = "invalid"


class NotFound(HfaiError):
    """The named job (or node) does not exist."""

    code = "not_found"


class Forbidden(HfaiError):
    """The caller's proven identity may not do this (another user's job, an operator verb)."""

    code = "forbidden"


class Conflict(HfaiError):
    """A compare-and-set lost a race, or the request conflicts with the job's current state."""

    code = "conflict"


class Unavailable(HfaiError):
    """No controller answered, or the cluster cannot be reached."""

    code = "unavailable"


class Timeout(HfaiError, TimeoutError):
    """Waited as long as the caller allowed (``Experiment.wait(timeout=...)``); nothing failed."""

    code = "timeout"


class IllegalTransition(HfaiError):
    """A lifecycle was asked to move along an edge its enum does not allow."""

    code = "illegal_transition"


_BY_CODE = {cls.code: cls for cls in (HfaiError, ProtocolError, InvalidRequest, NotFound, Forbidden, Conflict,
                                       Unavailable, Timeout, IllegalTransition)}


def error_for_code(code: str) -> type[HfaiError]:
    """The error class for a wire ``code`` (unknown codes map to the base class)."""
    return _BY_CODE.get(code, HfaiError)
