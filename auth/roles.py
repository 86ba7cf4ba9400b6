"""What each role may publish and subscribe to: the narrowest permissions that work (pure).

Identity rides on subjects (NATS does not tell a subscriber who published): a message on
``hfai.api.alice.<verb>`` proves alice because the server lets nobody else publish there, and one
on ``hfai.api.alice.op.<verb>`` proves an operator because only operators' credentials allow it.
Each role gets a private inbox prefix, so nobody can subscribe to another's replies.
"""

from __future__ import annotations

import enum

from hfai.protocol import names
from hfai.protocol._lazy import frozen_dataclass


class Role(enum.StrEnum):
    USER = "user"
    OPERATOR = "operator"
    AGENT = "agent"
    CONTROLLER = "controller"
    # hfai-web's own credential: reads the queue, nodes and telemetry history; controls no job.
    WEB = "web"


@frozen_dataclass  # made at first use (hfai.protocol._lazy): a CLI call reads one's fields only
class Permissions:
    pub: tuple[str, ...]
    sub: tuple[str, ...]
    # May publish a reply to a request it received (the agents' log service answers the controller).
    responses: bool = False

    @property
    def inbox_prefix(self) -> str:
        """The inbox prefix a client with these permissions must use for its replies."""
        for s in self.sub:
            if s.startswith("_INBOX") and s.endswith(".>"):
                return s[:-2]
        return "_INBOX"


def _kv(bucket: str) -> str:
    return f"KV_{bucket}"


def permissions(role: Role, name: str) -> Permissions:
    names.check_token("name", name)
    inbox = names.inbox_prefix(role.value, name)
    if role in (Role.USER, Role.OPERATOR):
        exec_ = f"{names.AGENT_PREFIX}.*.{names.EXEC_TOKEN}.{name}"  # hfai exec on any node, under their name
        pub = [names.api_subject(name, "*"), names.storage_subject(name, "*"), exec_,
               f"{exec_}.*.{names.EXEC_IN}"]
        if role is Role.OPERATOR:
            pub += [names.api_subject(name, "*", operator=True), names.storage_subject(name, "*", operator=True),
                    f"{names.AGENT_PREFIX}.*.{names.OPERATOR_TOKEN}.{name}.*"]  # any node's agent operations
        return Permissions(pub=tuple(pub), sub=(f"{inbox}.>", f"{exec_}.*.{names.EXEC_OUT}"))
    if role is Role.AGENT:
        return _agent(name, inbox)
    if role is Role.WEB:
        return _web(name, inbox)
    return Permissions(pub=(">",), sub=(">",))  # the controller runs the platform: it is trusted


def _agent(node: str, inbox: str) -> Permissions:
    """A node's agent: its own heartbeat, telemetry and events; read access to the assignment
    bucket (ordered consumers on it cannot be filtered by permissions, so it may read other
    nodes' assignments, never write them); requests for its log service and exec sessions, and
    the output of those sessions."""
    assign, nodes_kv = _kv(names.BUCKET_ASSIGN), _kv(names.BUCKET_NODES)
    js = "$JS.API"
    pub = (
        names.event_subject(node),
        names.telemetry_subject(node),
        f"$KV.{names.BUCKET_NODES}.{node}",
        f"{js}.INFO",
        f"{js}.STREAM.INFO.{assign}",
        f"{js}.STREAM.INFO.{nodes_kv}",
        f"{js}.STREAM.INFO.{names.EVENTS_STREAM}",
        f"{js}.CONSUMER.CREATE.{assign}",
        f"{js}.CONSUMER.CREATE.{assign}.>",
        f"{js}.CONSUMER.DELETE.{assign}.>",
        f"{js}.CONSUMER.INFO.{assign}.>",
        f"{js}.DIRECT.GET.{assign}.>",
        f"{js}.STREAM.MSG.GET.{assign}",
        f"$JS.FC.{assign}.>",
        f"{names.AGENT_PREFIX}.{node}.{names.EXEC_TOKEN}.*.*.{names.EXEC_OUT}",  # its exec sessions' output
    )
    return Permissions(pub=pub, sub=(f"{inbox}.>", f"{names.AGENT_PREFIX}.{node}.>"), responses=True)


def _web(name: str, inbox: str) -> Permissions:
    """hfai-web: the read-only API verbs under its own name (everyone may see the queue, nodes and
    usage), and an ordered consumer on the telemetry history stream. Users act through the web
    with their own credentials, never this one."""
    stream, js = names.TELEMETRY_STREAM, "$JS.API"
    pub = tuple(names.api_subject(name, verb) for verb in (names.VERB_LIST, names.VERB_NODES, names.VERB_SETTINGS,
                                                             names.VERB_USAGE)) + (
        f"{js}.INFO",
        f"{js}.STREAM.INFO.{stream}",
        f"{js}.CONSUMER.CREATE.{stream}",
        f"{js}.CONSUMER.CREATE.{stream}.>",
        f"{js}.CONSUMER.DELETE.{stream}.>",
        f"{js}.CONSUMER.INFO.{stream}.>",
        f"$JS.FC.{stream}.>",
        f"{names.AGENT_PREFIX}.*.dev",  # where a development session listens (the agent checks its owner)
    )
    return Permissions(pub=pub, sub=(f"{inbox}.>",))


def nats_claims(p: Permissions) -> dict:
    """The ``nats`` part of a user JWT granting ``p``."""
    claims: dict = {
        "type": "user",
        "pub": {"allow": list(p.pub)},
        "sub": {"allow": list(p.sub)},
        "subs": -1, "data": -1, "payload": -1,
    }
    if p.responses:
        claims["resp"] = {"max": 1, "ttl": 0}
    return claims


def from_claims(nats: dict) -> Permissions:
    """Read permissions back from a JWT's ``nats`` claims (a client choosing its inbox and subjects)."""
    return Permissions(pub=tuple(nats.get("pub", {}).get("allow", ())),
                       sub=tuple(nats.get("sub", {}).get("allow", ())),
                       responses=bool(nats.get("resp")))


def is_operator(p: Permissions, name: str) -> bool:
    return names.api_subject(name, "*", operator=True) in p.pub
