"""What the agent accepts from outside (pure checks): assignments, log requests, paths.

Whatever can write the assignment bucket or reach the log subject is not trusted to be sane: a
forged or corrupted entry must not make the agent (often root) write outside its state directory
or run anything. Every identifier that becomes a path, a uid or part of a command line is checked
here against the one strict name pattern (``protocol.names``); every path built from one is
checked to resolve under the agent's state root as well.
"""

from __future__ import annotations

import re
from pathlib import Path

from hfai.protocol.errors import HfaiError, InvalidRequest
from hfai.protocol.names import is_token
from hfai.protocol.types import LogRequest, NodeAssignment, RunAssignment

# The largest log slice one reply carries. NATS refuses messages over its max_payload (1 MiB by
# default); the client pages by offset, so a small cap costs a few more requests at most.
LOG_CHUNK_MAX = 256 * 1024
# Ranks, ports and counts beyond these are not a real job on a real cluster.
_MAX_WORLD = 1 << 20
_RUN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,64}\.[0-9]{1,18}$")


class StartError(HfaiError):
    """The run cannot start on this node (unknown environment, unknown user, missing workdir, ...)."""


def short(value: object, limit: int = 80) -> str:
    """``repr`` cut to ``limit`` characters: attacker-sized values keep a log line one line."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def is_run_key(key: str) -> bool:
    return bool(_RUN_KEY.match(key or ""))


def run_problem(ra: RunAssignment) -> str | None:
    """Why this run cannot be genuine (None if every identifier is well-formed)."""
    for what, value in (("job id", ra.job_id), ("user", ra.user), ("group", ra.group)):
        if not is_token(value):
            return f"{what} {short(value)} is not a name"
    if ra.env_name and not is_token(ra.env_name):
        return f"environment {short(ra.env_name)} is not a name"
    if not 0 <= ra.run_id < 10**18:
        return f"run id {ra.run_id} is out of range"
    if not (1 <= ra.world_size <= _MAX_WORLD and 0 <= ra.rank < ra.world_size):
        return f"rank {ra.rank} of world size {ra.world_size} is out of range"
    if not (0 <= ra.master_port <= 65535 and ra.suspend_count >= 0):
        return f"master port {ra.master_port} or suspend count {ra.suspend_count} is out of range"
    return None


def assignment_problem(a: NodeAssignment, node: str) -> str | None:
    """Why this node assignment must be refused as a whole (None if acceptable).

    The controller validates every name it stores, so one malformed run means the entry was not
    written by a correct controller: nothing in it is applied, its fence included (a forged entry
    with a huge fence would otherwise lock out every genuine assignment).
    """
    if a.node != node:
        return f"it is addressed to node {short(a.node)}, not {node!r}"
    for ra in a.runs:
        problem = run_problem(ra)
        if problem:
            return f"run {short(ra.job_id)}.{ra.run_id}: {problem}"
    return None


def check_log_request(req: LogRequest) -> LogRequest:
    """The request with ``max_bytes`` clamped to what one reply may carry; InvalidRequest if
    the job id or rank cannot name a log file or the offset is negative."""
    if not is_token(req.job_id):
        raise InvalidRequest(f"job id {short(req.job_id)} may only use letters, digits, '_' and '-' (1-64 chars)")
    if not 0 <= req.rank < _MAX_WORLD:
        raise InvalidRequest(f"rank {req.rank} is out of range")
    if req.offset < 0:
        raise InvalidRequest(f"offset {req.offset} is negative")
    return LogRequest(job_id=req.job_id, rank=req.rank, offset=req.offset,
                      max_bytes=max(0, min(req.max_bytes, LOG_CHUNK_MAX)), timestamps=req.timestamps)


def inside(root: Path, path: Path) -> Path:
    """``path`` if it resolves under ``root`` (itself resolved), else InvalidRequest."""
    if not path.resolve().is_relative_to(root):
        raise InvalidRequest(f"{path} is outside the agent's state directory {root}")
    return path
