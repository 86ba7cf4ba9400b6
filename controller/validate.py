"""Is a job spec something the agents can launch? Decided once, at submit (pure functions).

Everything a spec holds ends up in an ``execve`` on some node (argv, environment, working
directory) or on somebody's terminal (the name). A spec that cannot be launched — a NUL in an
argument or a variable, ``=`` in a variable name — would be accepted and then fail on the node
with a Python ``ValueError``, recorded as a mysterious exit. It is refused here instead, with an
``InvalidRequest`` whose one-line message names the field and says what to fix.

:func:`check_spec` looks at the spec alone; :func:`check_placement` at the spec and the nodes of
its group; :func:`validate_spec` does both, static checks first, so a spec is never refused for
its group while something about the spec itself is also wrong. :func:`check_quota` comes last,
once AUTO is resolved to a level.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from hfai.controller.policy import Quotas
from hfai.protocol import encode, names
from hfai.protocol.errors import Conflict, InvalidRequest
from hfai.protocol.limits import MAX_ARRAY, MAX_ARRAY_INDEX, MAX_HANG_RESTARTS, MAX_NODES, MAX_RETRIES
from hfai.protocol.types import AUTO_PRIORITY, JOB_DEV, JOB_KINDS, JobSpec, NodeRecord, Priority

MAX_NAME = 128
MAX_ARGS = 4096
MAX_ENV_VARS = 1024
MAX_ENV_KEY = 256
MAX_WORKDIR = 4096  # PATH_MAX
# A job's spec is copied into its record (with 50 history lines), into every list page and into
# each of its nodes' assignments, which all travel as single NATS messages (1 MiB by default).
MAX_SPEC_BYTES = 64 * 1024

# Portable environment variable names (POSIX): what every shell and launcher can pass on.
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PRIORITIES = frozenset(p.value for p in Priority) | {AUTO_PRIORITY}
_SHOW = 40


def show(value: object) -> str:
    """A value quoted for a message: repr (so control characters show as escapes), shortened."""
    text = repr(value)
    return text if len(text) <= _SHOW else text[: _SHOW - 1] + "…"


def check_name(name: str) -> str:
    """A job name: 1-128 printable characters (no control characters or terminal escapes, no
    NUL), no '/' and not '.' or '..' (scripts put $MARSV2_NB_NAME into paths), no surrounding
    spaces."""
    if not 1 <= len(name) <= MAX_NAME:
        raise InvalidRequest(f"job name must be 1-{MAX_NAME} characters, not {len(name)}; use a shorter --name")
    if not name.isprintable():
        bad = next(c for c in name if not c.isprintable())
        raise InvalidRequest(f"job name {show(name)} contains the control character {show(bad)}; "
                             "use only printable characters")
    if "/" in name or name in (".", ".."):
        raise InvalidRequest(f"job name {show(name)} may not contain '/' or be '.' or '..'; choose another --name")
    if name != name.strip():
        raise InvalidRequest(f"job name {show(name)} starts or ends with a space; remove it")
    return name


def check_entrypoint(argv: tuple[str, ...]) -> None:
    if not argv or not argv[0]:
        raise InvalidRequest("the job has no command to run")
    if len(argv) > MAX_ARGS:
        raise InvalidRequest(f"the command has {len(argv)} arguments, at most {MAX_ARGS} are allowed")
    for i, arg in enumerate(argv):
        if "\0" in arg:
            raise InvalidRequest(f"argument {i} of the command ({show(arg)}) contains a NUL byte, "
                                 "which no program can receive; remove it")


def check_env(env: dict[str, str]) -> None:
    if len(env) > MAX_ENV_VARS:
        raise InvalidRequest(f"the job sets {len(env)} environment variables, at most {MAX_ENV_VARS} are allowed")
    for key, value in env.items():
        if not key:
            raise InvalidRequest("an environment variable has an empty name; use -e NAME=VALUE")
        if "=" in key:
            raise InvalidRequest(f"environment variable name {show(key)} contains '='; use -e NAME=VALUE "
                                 "with '=' only after the name")
        if len(key) > MAX_ENV_KEY or not _ENV_KEY.fullmatch(key):
            raise InvalidRequest(f"environment variable name {show(key)} must be letters, digits and '_', "
                                 f"not starting with a digit (at most {MAX_ENV_KEY})")
        if "\0" in value:
            raise InvalidRequest(f"environment variable {key} contains a NUL byte, which no program can "
                                 "receive; remove it")


def check_workdir(workdir: str) -> None:
    if "\0" in workdir:
        raise InvalidRequest(f"workdir {show(workdir)} contains a NUL byte; submit from a real directory")
    if len(workdir) > MAX_WORKDIR:
        raise InvalidRequest(f"workdir is {len(workdir)} characters long, at most {MAX_WORKDIR} are allowed")
    if not workdir.startswith("/"):
        raise InvalidRequest(f"workdir must be an absolute path, not {show(workdir)}")


def check_sizes(spec: JobSpec) -> None:
    """Node counts within 1..MAX_NODES; an elastic range must be 1 <= min < max == nodes (min == max
    is accepted as a fixed size)."""
    if not 1 <= spec.nodes <= MAX_NODES:
        if spec.nodes < 1:
            raise InvalidRequest(f"a job needs at least 1 node, not {spec.nodes}")
        raise InvalidRequest(f"a job may ask for at most {MAX_NODES} nodes, not {spec.nodes}")
    if spec.max_nodes or spec.min_nodes:
        if not 1 <= spec.min_nodes <= spec.max_nodes == spec.nodes:
            raise InvalidRequest(f"an elastic job needs 1 <= min <= max nodes with max = nodes "
                                 f"(got {spec.min_nodes}:{spec.max_nodes}, nodes {spec.nodes})")


def check_kind(spec: JobSpec) -> None:
    """A known kind; a development session runs on one node, at a fixed size."""
    if spec.kind not in JOB_KINDS:
        raise InvalidRequest(f"unknown job kind {show(spec.kind)}: use one of {', '.join(JOB_KINDS)}")
    if spec.kind == JOB_DEV and (spec.nodes != 1 or spec.elastic):
        raise InvalidRequest(f"a development session runs on 1 node, not {spec.nodes}")


def check_dev_limit(spec: JobSpec, live: int, max_per_user: int) -> None:
    """Refuse a development session over ``[dev] max_per_user`` (``live``: the user's sessions
    queued or running now)."""
    if spec.kind == JOB_DEV and live >= max_per_user:
        raise Conflict(f"{spec.user} already has {live} development session{'s' if live != 1 else ''} "
                       f"(at most {max_per_user} at once): stop one first (hfai dev list, hfai dev stop NAME)")


def check_spec(spec: JobSpec) -> JobSpec:
    """Everything about a spec that does not depend on the cluster; returns it unchanged."""
    check_name(spec.name)
    check_sizes(spec)
    check_kind(spec)
    if spec.priority not in _PRIORITIES:
        raise InvalidRequest(f"unknown priority {spec.priority}: use {Priority.choices()}")
    if not names.is_token(spec.group):
        raise InvalidRequest(f"group {show(spec.group)} may only use letters, digits, '_' and '-' (1-64 chars)")
    if spec.env_name and not names.is_token(spec.env_name):
        raise InvalidRequest(f"environment name HF_ENV_NAME={show(spec.env_name)} may only use letters, digits, "
                             "'_' and '-' (1-64 chars)")
    check_entrypoint(spec.entrypoint)
    check_env(spec.env)
    check_workdir(spec.workdir)
    check_limits(spec)
    size = len(encode(spec))
    if size > MAX_SPEC_BYTES:
        raise InvalidRequest(f"the job spec is {size} bytes, at most {MAX_SPEC_BYTES} are allowed; "
                             "shorten the command line or the environment")
    return spec


MAX_AFTER = 64
DEPENDENCY_KINDS = ("ok", "any")


def parse_dependency(entry: str) -> tuple[str, str]:
    """``"ID"``, ``"ID:ok"`` (start once ID succeeded) or ``"ID:any"`` (once it ended at all)."""
    job_id, _, kind = entry.partition(":")
    kind = kind or "ok"
    if not names.is_token(job_id) or kind not in DEPENDENCY_KINDS:
        raise InvalidRequest(f"dependency {show(entry)}: expected JOB_ID or JOB_ID:ok or JOB_ID:any")
    return job_id, kind


def check_limits(spec: JobSpec) -> None:
    """Dependencies, time limit, retries and array settings are well-formed."""
    if len(spec.after) > MAX_AFTER:
        raise InvalidRequest(f"at most {MAX_AFTER} dependencies (--after), not {len(spec.after)}")
    for entry in spec.after:
        parse_dependency(entry)
    if not spec.time_limit_s >= 0:
        raise InvalidRequest(f"the time limit must be 0 (none) or more seconds, not {spec.time_limit_s}")
    if not 0 <= spec.retries <= MAX_RETRIES:
        raise InvalidRequest(f"--retry takes 0 to {MAX_RETRIES}, not {spec.retries}")
    if not 0 <= spec.restart_on_hang <= MAX_HANG_RESTARTS:
        raise InvalidRequest(f"--restart-on-hang takes 0 to {MAX_HANG_RESTARTS}, not {spec.restart_on_hang}")
    if not 0 <= spec.array_limit <= MAX_ARRAY:
        raise InvalidRequest(f"an array's limit (%N) must be 1 to {MAX_ARRAY}, not {spec.array_limit}")


def check_array(indices: tuple[int, ...]) -> tuple[int, ...]:
    """A job array's indices: distinct, 0 to MAX_ARRAY_INDEX, at most MAX_ARRAY of them."""
    if len(indices) > MAX_ARRAY:
        raise InvalidRequest(f"a job array has at most {MAX_ARRAY} members, not {len(indices)}")
    if len(set(indices)) != len(indices) or any(not 0 <= i <= MAX_ARRAY_INDEX for i in indices):
        raise InvalidRequest(f"a job array's indices must be distinct and 0 to {MAX_ARRAY_INDEX}")
    return indices


def check_placement(spec: JobSpec, nodes: Iterable[NodeRecord]) -> JobSpec:
    """Can the spec's group ever run it: does it have the nodes and the environment?"""
    group_nodes = [r for r in nodes if r.group == spec.group]
    if not group_nodes:
        raise InvalidRequest(f"group {spec.group!r} has no nodes")
    least = spec.min_nodes if spec.elastic else spec.nodes
    if least > len(group_nodes):
        raise InvalidRequest(f"the job asks for {least} nodes but group {spec.group!r} has {len(group_nodes)}")
    if spec.env_name:
        offered = set.intersection(*(set(r.envs) for r in group_nodes))
        if spec.env_name not in offered:
            known = ", ".join(sorted(offered)) or "none"
            raise InvalidRequest(f"unknown environment HF_ENV_NAME={spec.env_name!r}; "
                                 f"environments on group {spec.group!r}: {known}")
    return spec


def check_quota(spec: JobSpec, quotas: Quotas) -> JobSpec:
    """Could the job ever start under its user's quota? One that needs more nodes than the quota
    of its (user, priority, group) allows would wait forever, so it is refused like a job larger
    than its group. ``spec.priority`` must be resolved (not AUTO)."""
    limit = quotas.limit(spec.user, spec.priority, spec.group, spec.by_operator)
    least = spec.min_nodes if spec.elastic else spec.nodes
    if limit == 0 and quotas.closed_by_default(spec.user, spec.priority, spec.group, spec.by_operator):
        level = Priority.label(spec.priority)
        raise InvalidRequest(f"{level} needs a quota and {spec.user} has none in group {spec.group!r}: the levels "
                             f"above {Priority.label(quotas.closed_above or 0)} are closed until an operator sets "
                             f"one (hfai quota set {spec.user} {level} N, or '*' for everyone); submit at NORMAL "
                             "or lower, or see `hfai quota`")
    if limit is not None and least > limit:
        raise InvalidRequest(f"the job needs {least} node(s) but {spec.user}'s quota at "
                             f"{Priority.label(spec.priority)} in group {spec.group!r} is {limit}, so it could "
                             "never start; submit at another priority or ask an operator for more")
    return spec


def validate_spec(spec: JobSpec, nodes: Iterable[NodeRecord]) -> JobSpec:
    """The submit-time check: :func:`check_spec`, then :func:`check_placement`."""
    return check_placement(check_spec(spec), nodes)
