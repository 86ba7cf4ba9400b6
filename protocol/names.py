"""Every NATS subject, stream, bucket and consumer name. Nothing else in hfai spells them.

API subjects carry the caller's user name as a token (``hfai.api.<user>.<verb>``): the controller
takes the user from the subject, never from the payload, so NATS permissions alone can confine a
user to their own subjects.
"""

from __future__ import annotations

import re

from hfai.protocol.errors import InvalidRequest

API_PREFIX = "hfai.api"
API_WILDCARD = f"{API_PREFIX}.>"
# The token that marks an operator's request: hfai.api.<user>.op.<verb>.
OPERATOR_TOKEN = "op"
API_QUEUE = "hfai-controller"
# Why waiting jobs wait (protocol/waits.py): the leader publishes, every controller replica reads.
# Core NATS, not JetStream: nothing is stored, and a replica that missed a batch has every
# reason again at the leader's next full publish.
WAITS_SUBJECT = "hfai.waits"

VERB_SUBMIT = "submit"
VERB_LIST = "list"
VERB_STATUS = "status"
VERB_STOP = "stop"
VERB_NODES = "nodes"
VERB_QUOTA_SET = "quota_set"
VERB_SETTINGS = "settings"
VERB_DRAIN = "drain"
VERB_LOGS = "logs"
# GPU-hours per day, user, group and priority (hfai usage, hfai-web).
VERB_USAGE = "usage"
# Hold/release a waiting job, requeue a running one, change a waiting one.
VERB_HOLD = "hold"
VERB_REQUEUE = "requeue"
VERB_UPDATE = "update"
# Start-time estimates of waiting jobs (controller/estimate.py).
VERB_ESTIMATE = "estimate"
VERBS = (VERB_SUBMIT, VERB_LIST, VERB_STATUS, VERB_STOP, VERB_NODES, VERB_QUOTA_SET, VERB_SETTINGS, VERB_DRAIN,
         VERB_LOGS, VERB_USAGE, VERB_HOLD, VERB_REQUEUE, VERB_UPDATE, VERB_ESTIMATE)

AGENT_PREFIX = "hfai.agent"

# The storage service (hfai-storage): hfai.storage.<user>.<verb>, operators hfai.storage.<user>.op.<verb>.
# Subjects of their own, so the controllers' queue group on hfai.api.> never answers them.
STORAGE_PREFIX = "hfai.storage"
STORAGE_WILDCARD = f"{STORAGE_PREFIX}.>"
STORAGE_QUEUE = "hfai-storage"

EVENTS_STREAM = "HFAI_EVENTS"
EVENTS_PREFIX = "hfai.events"
EVENTS_WILDCARD = f"{EVENTS_PREFIX}.>"
EVENTS_CONSUMER = "hfai-leader"

TELEMETRY_PREFIX = "hfai.telemetry"
TELEMETRY_WILDCARD = f"{TELEMETRY_PREFIX}.>"
# The last hour (configurable) of every node's telemetry, for hfai-web's charts (docs/web.md).
TELEMETRY_STREAM = "HFAI_TELEMETRY"

BUCKET_LEADER = "hfai_leader"
BUCKET_JOBS = "hfai_jobs"
BUCKET_NODES = "hfai_nodes"
BUCKET_ASSIGN = "hfai_assign"
# Operator settings: quotas (key "quotas") and drained nodes (key "drained").
BUCKET_USERS = "hfai_users"
# One UsageEntry per finished run (key <job id>.<run id>): GPU-hours outlive purged job records.
BUCKET_USAGE = "hfai_usage"
# The store's health probes (controller/store_health.py): one key per prober, written every few
# seconds; on the file store, so a disk that refuses writes shows there as it does for the jobs.
BUCKET_HEALTH = "hfai_health"
QUOTAS_KEY = "quotas"
DRAINED_KEY = "drained"
# Users whose jobs may not run (storage over its limit, ...): a RestrictedUsers, written by operator services.
RESTRICTED_KEY = "restricted"

LEADER_KEY = "leader"

# A NATS subject token / KV key we accept for user and node names: no dots, spaces or wildcards.
_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def check_token(what: str, value: str) -> str:
    """Return ``value`` if it can be a subject token and a KV key, else raise InvalidRequest."""
    if not _TOKEN.match(value or ""):
        raise InvalidRequest(f"{what} {value!r} may only use letters, digits, '_' and '-' (1-64 chars)")
    return value


def is_token(value: str) -> bool:
    return bool(_TOKEN.match(value or ""))


def api_subject(user: str, verb: str, operator: bool = False) -> str:
    role = f".{OPERATOR_TOKEN}" if operator else ""
    return f"{API_PREFIX}.{check_token('user name', user)}{role}.{verb}"


def parse_api_subject(subject: str) -> tuple[str, str, bool]:
    """(user, verb, operator) of an API subject; raises InvalidRequest for anything else."""
    parts = subject.split(".")
    if ".".join(parts[:2]) != API_PREFIX or len(parts) not in (4, 5) or \
            (len(parts) == 5 and parts[3] != OPERATOR_TOKEN):
        raise InvalidRequest(f"not an API subject: {subject[:200]}")
    return parts[2], parts[-1], len(parts) == 5


def storage_subject(user: str, verb: str, operator: bool = False) -> str:
    return api_subject(user, verb, operator).replace(API_PREFIX, STORAGE_PREFIX, 1)


def parse_storage_subject(subject: str) -> tuple[str, str, bool]:
    """(user, verb, operator) of a storage subject; raises InvalidRequest for anything else."""
    if not subject.startswith(STORAGE_PREFIX + "."):
        raise InvalidRequest(f"not a storage subject: {subject[:200]}")
    return parse_api_subject(API_PREFIX + subject[len(STORAGE_PREFIX):])


def inbox_prefix(role: str, name: str) -> str:
    """The private reply inbox of a connection with that role and name (its permissions allow
    subscribing only below it, so nobody reads another's replies)."""
    return f"_INBOX_{role[0]}_{check_token('name', name)}"


def event_subject(node: str) -> str:
    return f"{EVENTS_PREFIX}.{node}"


def telemetry_subject(node: str) -> str:
    return f"{TELEMETRY_PREFIX}.{node}"


def agent_logs_subject(node: str) -> str:
    return f"{AGENT_PREFIX}.{node}.logs"


# Operator operations on one node's agent: hfai.agent.<node>.op.<user>.<verb>. Only operators'
# credentials (and the controllers') may publish there (hfai.auth.roles), so the subject proves
# the caller an operator, as on the API.
AGENT_OP_SUSPEND = "suspend"
AGENT_OPS = (AGENT_OP_SUSPEND,)
# The node's health watch (agent/health_watch.py) serves this one: inject a fault into simulated
# GPUs, validate the node, put a node a fault drained back in service.
AGENT_OP_HEALTH = "health"


def agent_op_subject(node: str, user: str, verb: str) -> str:
    return f"{AGENT_PREFIX}.{check_token('node name', node)}.{OPERATOR_TOKEN}.{check_token('user name', user)}.{verb}"


def agent_op_wildcard(node: str, verb: str) -> str:
    """What one node's agent subscribes to for the operator operation ``verb`` (one subscription
    per verb: each verb has its own server in the agent)."""
    return f"{AGENT_PREFIX}.{node}.{OPERATOR_TOKEN}.*.{verb}"


def parse_agent_op_subject(subject: str) -> tuple[str, str, str]:
    """(node, user, verb) of an agent operation's subject; raises InvalidRequest for anything else."""
    parts = subject.split(".")
    if ".".join(parts[:2]) != AGENT_PREFIX or len(parts) != 6 or parts[3] != OPERATOR_TOKEN:
        raise InvalidRequest(f"not an agent operation's subject: {subject[:200]}")
    return parts[2], parts[4], parts[5]


def agent_dev_subject(node: str) -> str:
    """Where hfai-web asks one node's agent for a development session's address (only hfai-web
    and the controllers may publish there, hfai.auth.roles)."""
    return f"{AGENT_PREFIX}.{check_token('node name', node)}.dev"


# Commands in a running job's processes (hfai exec, hfai shell; agent/exec.py). A user asks on
# hfai.agent.<node>.exec.<user>, which every user may publish under their own name (the agent
# admits the job's owner alone); an operator on the operator operation hfai.agent.<node>.op.<user>.exec
# (any job). A session's bytes travel on hfai.agent.<node>.exec.<user>.<session>.out (agent to
# caller) and .in (caller to agent), named after the caller, whom NATS alone lets subscribe to
# the one and publish on the other: nobody else reads or types into a session.
AGENT_OP_EXEC = "exec"
EXEC_TOKEN = "exec"
EXEC_OUT = "out"
EXEC_IN = "in"


def agent_exec_subject(node: str, user: str) -> str:
    """Where a user asks ``node``'s agent for a command in a job's processes."""
    return f"{AGENT_PREFIX}.{check_token('node name', node)}.{EXEC_TOKEN}.{check_token('user name', user)}"


def agent_exec_wildcard(node: str) -> str:
    """What one node's agent subscribes to for users' exec requests."""
    return f"{AGENT_PREFIX}.{node}.{EXEC_TOKEN}.*"


def parse_agent_exec_subject(subject: str) -> tuple[str, str, bool]:
    """(node, user, operator) of an exec request's subject; raises InvalidRequest for anything else."""
    parts = subject.split(".")
    if ".".join(parts[:2]) == AGENT_PREFIX and len(parts) == 5 and parts[3] == EXEC_TOKEN:
        return parts[2], parts[4], False
    node, user, verb = parse_agent_op_subject(subject)
    if verb != AGENT_OP_EXEC:
        raise InvalidRequest(f"not an exec request's subject: {subject[:200]}")
    return node, user, True


def exec_stream_subject(node: str, user: str, session: str, direction: str) -> str:
    """The subject of one direction (EXEC_OUT or EXEC_IN) of ``user``'s exec session on ``node``."""
    if direction not in (EXEC_OUT, EXEC_IN):
        raise InvalidRequest(f"an exec session has no direction {direction!r}")
    return (f"{AGENT_PREFIX}.{check_token('node name', node)}.{EXEC_TOKEN}.{check_token('user name', user)}."
            f"{check_token('exec session', session)}.{direction}")
