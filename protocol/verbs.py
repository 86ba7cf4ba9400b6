"""The controller API's verbs, each stated once: the request it takes, the reply it gives, and
whether a client may send it more than once.

The controller dispatches by this table (hfai.controller.api: each verb's request decoded as its
``request`` type) and the client calls by it (``ApiClient.call(verbs.STATUS, JobRequest(...))``
is typed ``JobReply``, and is sent again or elsewhere as ``repeatable`` and ``movable`` say).

``repeatable``: reads, and changes that set a value, so that a second copy finds it set and
changes nothing (stop: a stopping or final job is left as it is; hold/release, update, quota_set,
drain: the same value again). A hung replica then does not fail the call: copies go on a schedule
to the replicas' queue group (hfai.api.client.try_plan). Not requeue (a second copy would interrupt
the job's next run, or fail on the first's result), nor submit, which is ``movable`` instead: its
copies go only through another server when the first seems cut off, named by a ``request_id``
that the controller dedups on.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from hfai.protocol import names
from hfai.protocol._lazy import frozen_dataclass
from hfai.protocol.codec import Encoded
from hfai.protocol.types import (
    DrainRequest,
    EstimateReply,
    EstimateRequest,
    HoldRequest,
    JobList,
    JobReply,
    JobRequest,
    ListRequest,
    LogChunk,
    LogRequest,
    NodesReply,
    NodesRequest,
    QuotaSetRequest,
    QuotasRequest,
    RequeueRequest,
    SettingsReply,
    StopRequest,
    SubmitRequest,
    UpdateRequest,
    UsageReply,
    UsageRequest,
)

Req = TypeVar("Req")
Rep = TypeVar("Rep")


@frozen_dataclass  # made at first use (hfai.protocol._lazy), like the messages
class Verb(Generic[Req, Rep]):
    """One API verb: its name (the subject's last token), its request and reply types, and
    whether its request may be sent more than once (see the module docstring)."""

    name: str
    request: type[Req]
    reply: type[Rep]
    repeatable: bool = False
    movable: bool = False

    def check(self, request: object) -> None:
        """Raise TypeError unless ``request`` is of this verb's request type, or one encoded
        already (:class:`hfai.protocol.codec.Encoded`) whose kind is that type's."""
        if isinstance(request, self.request):
            return
        kind = getattr(self.request, "KIND", None)
        if isinstance(request, Encoded) and request.kind == kind:
            return
        got = f"an encoded {request.kind or 'message'}" if isinstance(request, Encoded) else \
            f"a {type(request).__name__}"
        raise TypeError(f"{self.name} takes a {self.request.__name__}, not {got}")


SUBMIT = Verb(names.VERB_SUBMIT, SubmitRequest, JobReply, movable=True)
LIST = Verb(names.VERB_LIST, ListRequest, JobList, repeatable=True)
STATUS = Verb(names.VERB_STATUS, JobRequest, JobReply, repeatable=True)
STOP = Verb(names.VERB_STOP, StopRequest, JobReply, repeatable=True)
NODES = Verb(names.VERB_NODES, NodesRequest, NodesReply, repeatable=True)
QUOTA_SET = Verb(names.VERB_QUOTA_SET, QuotaSetRequest, SettingsReply, repeatable=True)
SETTINGS = Verb(names.VERB_SETTINGS, QuotasRequest, SettingsReply, repeatable=True)
DRAIN = Verb(names.VERB_DRAIN, DrainRequest, SettingsReply, repeatable=True)
LOGS = Verb(names.VERB_LOGS, LogRequest, LogChunk, repeatable=True)
USAGE = Verb(names.VERB_USAGE, UsageRequest, UsageReply, repeatable=True)
HOLD = Verb(names.VERB_HOLD, HoldRequest, JobReply, repeatable=True)
REQUEUE = Verb(names.VERB_REQUEUE, RequeueRequest, JobReply)
UPDATE = Verb(names.VERB_UPDATE, UpdateRequest, JobReply, repeatable=True)
ESTIMATE = Verb(names.VERB_ESTIMATE, EstimateRequest, EstimateReply, repeatable=True)

#: Every verb by name: what the controller serves, and all it serves.
VERBS: dict[str, Verb] = {v.name: v for v in (SUBMIT, LIST, STATUS, STOP, NODES, QUOTA_SET, SETTINGS, DRAIN, LOGS,
                                               USAGE, HOLD, REQUEUE, UPDATE, ESTIMATE)}
