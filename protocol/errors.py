"""One small error tree for the whole platform.

Every error a user can cause derives from :class:`HfaiError` and carries a message that says what
went wrong and what to do; the CLI prints it without a traceback. ``code`` travels in
``ErrorReply`` so a client can re-raise the same class on its side, and ``sub`` (an
:class:`ErrorSub`) with it: code that must tell two cases of one class apart reads ``sub``, never
the message, which is for people and may be reworded.
"""

from __future__ import annotations

import enum


class ErrorSub(enum.StrEnum):
    """Which case of its class an error is, where some code decides on it. Travels as its value
    in ``ErrorReply.sub``; a value this side does not know reads as ``NONE`` (:meth:`of`)."""

    NONE = ""
    #: Nobody serves the subject (NATS "no responders"): the service is not running.
    NO_RESPONDERS = "no_responders"
    #: Asked, and no answer came within the time allowed: the service is hung, slow or cut off.
    NO_ANSWER = "no_answer"
    #: The NATS server refused to let these credentials publish the subject (their permissions),
    #: not the service behind it refusing the request.
    SUBJECT_DENIED = "subject_denied"
    #: The NATS server refused the credentials themselves when connecting (revoked, unknown).
    CREDENTIALS_REFUSED = "credentials_refused"

    @classmethod
    def of(cls, value: str) -> ErrorSub:
        """The member for a wire value; ``NONE`` for one a newer peer added."""
        try:
            return cls(value)
        except ValueError:
            return cls.NONE


class HfaiError(Exception):
    """Base of every error hfai raises on purpose."""

    code = "error"
    sub = ErrorSub.NONE  # (also here: a subclass's __init__ may not pass through ours)

    def __init__(self, *args: object, sub: ErrorSub = ErrorSub.NONE) -> None:
        super().__init__(*args)
        self.sub = sub


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


def error_of(code: str, message: str, sub: str = "") -> HfaiError:
    """The error an ``ErrorReply`` stands for, to raise on the receiving side: its class by
    ``code``, its case by ``sub``."""
    return error_for_code(code)(message, sub=ErrorSub.of(sub))
