"""What a job runs with: its command line and its environment, as the agent builds them from a
:class:`~hfai.protocol.types.RunAssignment` (pure but for reading ``os.environ`` and testing that
the workdir and the named environment exist). The launcher (launcher.py) receives both in the run's
``launch`` spec and execs them as given."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hfai import base_envs
from hfai.agent.devsession import ENTRYPOINT as DEV_ENTRYPOINT
from hfai.agent.identity import RUN_AS_SUBMITTER, JobIdentity
from hfai.agent.trust import StartError
from hfai.base_envs import Resolved
from hfai.protocol.types import RunAssignment

__all__ = ["base_environment", "check_command", "env_note", "job_command", "job_environment", "job_python",
           "node_log_file", "resolve_env"]

#: MARSV2_USER_ROLE: the original told its own staff ("internal", no session time limits) from
#: outside users ("external"); its scripts compare the lower-case value. hfai has one kind of user.
USER_ROLE = "internal"

# Variables of the agent's own environment a job of another user must not inherit: the agent's
# settings (HFAI_*; the job gets its own HFAI_* below) and the agent account's login identity.
_AGENT_ONLY = ("HOME", "USER", "LOGNAME", "MAIL", "XDG_RUNTIME_DIR", "XDG_SESSION_ID", "SSH_AUTH_SOCK",
               "PWD", "OLDPWD")


def job_command(ra: RunAssignment, who: JobIdentity, *, node: str, control_dir: str, run_as: str,
                env_root: Path, datasets_dir: str = "") -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``ra``'s job on ``node``, run as ``who``; StartError if it
    cannot run here (no workdir, an unknown environment, something exec would refuse)."""
    if not os.path.isdir(ra.workdir):
        raise StartError(f"workdir {ra.workdir} does not exist on node {node}")
    env = base_environment(run_as) | who.env
    env.update(ra.env)
    python = sys.executable
    if ra.env_name:
        got = resolve_env(ra, env_root, node)
        env["PATH"] = f"{got.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        if not got.base or os.path.isfile(os.path.join(got.path, "pyvenv.cfg")):
            env["VIRTUAL_ENV"] = got.path  # a virtualenv (a conda or system prefix is none)
        python = got.python_exe
    env.update(job_environment(ra, node, control_dir, uid=who.account.uid,
                               log_file=node_log_file(control_dir, ra)))
    if datasets_dir:
        env["HFAI_DATASETS_DIR"] = datasets_dir
    # hf_env.set_env(NAME) in the job looks for environments here (jobs run as their submitter
    # do not get the agent's HFAI_CONFIG, so they could not read [agent] env_root themselves).
    env["HFAI_ENV_ROOT"] = str(env_root)
    argv = list(ra.entrypoint)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = python
    check_command(argv, env, ra.workdir)
    return argv, env


def resolve_env(ra: RunAssignment, env_root: Path, node: str) -> Resolved:
    """The environment ``ra`` asks for (HF_ENV_NAME: a base environment's name or alias, or a
    user's environment); StartError if this node has none of that name."""
    got = base_envs.resolve(env_root, ra.env_name)
    if got is None:
        raise StartError(f"unknown environment HF_ENV_NAME={ra.env_name!r} on node {node}; "
                         f"{base_envs.known(env_root)}")
    return got


def job_python(ra: RunAssignment, env_root: Path) -> str:
    """The interpreter ``python`` means in ``ra``'s job: its environment's, else the agent's."""
    got = base_envs.resolve(env_root, ra.env_name) if ra.env_name else None
    return got.python_exe if got is not None else sys.executable


def env_note(ra: RunAssignment, env_root: Path) -> str:
    """What the job's log says of its environment ("" for none asked): which one it got."""
    got = base_envs.resolve(env_root, ra.env_name) if ra.env_name else None
    return got.describe if got is not None else ""


def base_environment(run_as: str) -> dict[str, str]:
    """What a job inherits from the agent's environment."""
    if run_as != RUN_AS_SUBMITTER:
        # The job is the agent's own account: nothing to hold back but the agent's credentials,
        # so that the job's hfai commands act as its user ([nats] creds_dir/<user>.creds, as any
        # CLI finds them), never as the node.
        return {k: v for k, v in os.environ.items() if k != "HFAI_NATS_CREDS"}
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("HFAI_", "SUDO_")) and k not in _AGENT_ONLY}


def check_command(argv: list[str], env: dict[str, str], workdir: str) -> None:
    """StartError for what exec would refuse (an empty command, NUL bytes, '=' in a name)."""
    if not argv:
        raise StartError("the entrypoint is empty")
    if any("\0" in a for a in argv) or "\0" in workdir:
        raise StartError("the entrypoint or workdir contains a NUL byte")
    for k, v in env.items():
        if not k or "=" in k or "\0" in k or "\0" in v:
            raise StartError(f"environment variable {k[:40]!r} cannot be set (empty, '=' or NUL in it)")


def node_log_file(control_dir: str, ra: RunAssignment) -> str:
    """The file the agent writes ``ra``'s output to on this node, found from the run's control
    directory: the run store keeps ``<state>/control/<run key>`` and
    ``<state>/logs/<job>/rank<r>.log`` (runs.py: log_path)."""
    state = Path(control_dir).parents[1]
    return str(state / "logs" / ra.job_id / f"rank{ra.rank}.log")


def job_environment(ra: RunAssignment, node: str, control_dir: str, *, uid: int | None = None,
                    log_file: str = "") -> dict[str, str]:
    """The variables a job sees: torch's names, HFAI_* and the original platform's names (its
    MASTER_IP and MARSV2_*, with their meaning there; docs/compat.md has the table). ``uid``: the
    account the job runs as (default: this process's); ``log_file``: where its output goes."""
    env = {
        "WORLD_SIZE": str(ra.world_size),
        "RANK": str(ra.rank),
        "MASTER_ADDR": ra.master_addr,
        "MASTER_PORT": str(ra.master_port),
        "HFAI_JOB_ID": ra.job_id,
        "HFAI_CHAIN_ID": ra.job_id,
        "HFAI_RUN_ID": str(ra.run_id),
        "HFAI_JOB_NAME": ra.name,
        "HFAI_USER": ra.user,
        "HFAI_GROUP": ra.group,
        "HFAI_PRIORITY": str(ra.priority),
        "HFAI_NODE": node,
        "HFAI_SUSPEND_COUNT": str(ra.suspend_count),
        "HFAI_RETRY_COUNT": str(ra.retry_count),  # failed runs requeued by --retry (not suspensions)
        "HFAI_WHOLE_LIFE_STATE": str(ra.whole_life_state),
        "HFAI_CONTROL_DIR": control_dir,
        "HF_ENV_NAME": ra.env_name,
        "PYTHONUNBUFFERED": "1",
    }
    return env | _original_names(ra, node, os.getuid() if uid is None else uid, log_file)


def _original_names(ra: RunAssignment, node: str, uid: int, log_file: str) -> dict[str, str]:
    """The original platform's variables (hai-platform's env_var list), but its user token: a job
    acts as its user through the credentials hfai finds, never a secret in its environment."""
    env = {
        "MASTER_IP": ra.master_addr,  # rank 0's address, as MASTER_ADDR
        "MARSV2_UID": str(uid),
        "MARSV2_USER": ra.user,
        "MARSV2_USER_ROLE": USER_ROLE,
        "MARSV2_NB_ID": ra.job_id,
        "MARSV2_NB_NAME": ra.name,
        "MARSV2_TASK_ID": ra.job_id,
        "MARSV2_TASK_TYPE": "jupyter" if tuple(ra.entrypoint) == DEV_ENTRYPOINT else "training",
        "MARSV2_WHOLE_LIFE_STATE": str(ra.whole_life_state),
        "MARSV2_SUSPEND_COUNT": str(ra.suspend_count),
        "MARSV2_RANK": str(ra.rank),
        "MARSV2_WORLD_SIZE": str(ra.world_size),
        "MARSV2_NODE_NAME": node,
    }
    if log_file:
        env["MARSV2_LOG_DIR"] = os.path.dirname(log_file)
        env["MARSV2_LOG_FILE_PATH"] = log_file
    return env
