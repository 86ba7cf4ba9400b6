"""As whom a job runs on this node: the decision (pure) and the account lookups it needs.

``[agent] run_as``:

* ``"submitter"`` (default, for shared clusters): the job runs as the Unix account named like its
  hfai user. An agent running as root switches to that account's uid, gid and supplementary
  groups; an account unknown on the node, or root itself, is refused. An agent not running as
  root cannot switch, so it runs only its own account's jobs and refuses everyone else's.
* ``"agent"`` (personal and test clusters only): every job runs as the agent's own account,
  whatever hfai user submitted it. On a shared cluster this hands every user the agent's account.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Callable
from dataclasses import dataclass, field

from hfai.agent.trust import StartError
from hfai.protocol.errors import InvalidRequest

RUN_AS_SUBMITTER = "submitter"
RUN_AS_AGENT = "agent"
RUN_AS = (RUN_AS_SUBMITTER, RUN_AS_AGENT)


@dataclass(frozen=True)
class Account:
    """A Unix account: what a job needs to run as it."""

    name: str
    uid: int
    gid: int
    home: str
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class JobIdentity:
    """The account a job runs as. ``switch``: the launcher must become it (agent is root)."""

    account: Account
    switch: bool
    env: dict[str, str] = field(default_factory=dict)  # HOME/USER/LOGNAME for the job, if set


def check_run_as(value: str) -> str:
    if value not in RUN_AS:
        raise InvalidRequest(f"[agent] run_as = {value!r}: use \"submitter\" (shared clusters) or \"agent\" "
                             f"(a personal cluster where every hfai user is the agent's own account)")
    return value


def job_identity(user: str, run_as: str, agent: Account, lookup: Callable[[str], Account | None]) -> JobIdentity:
    """The account the job of hfai user ``user`` runs as; StartError saying why it may not run.

    ``agent`` is the account the agent runs as, ``lookup`` finds a Unix account by name.
    """
    if check_run_as(run_as) == RUN_AS_AGENT:
        return JobIdentity(agent, switch=False)
    if agent.uid != 0:
        if user != agent.name:
            raise StartError(f"this agent runs as {agent.name!r}, not root, so it can only run {agent.name!r}'s "
                             f"jobs, not {user!r}'s (run the agent as root, or set [agent] run_as = \"agent\" "
                             f"on a personal cluster)")
        return JobIdentity(agent, switch=False, env=_login_env(agent))
    account = lookup(user)
    if account is None:
        raise StartError(f"user {user!r} has no Unix account on this node; jobs run as their submitter")
    if account.uid == 0:
        raise StartError(f"user {user!r} is root on this node; jobs never run as root")
    return JobIdentity(account, switch=True, env=_login_env(account))


def _login_env(account: Account) -> dict[str, str]:
    return {"HOME": account.home, "USER": account.name, "LOGNAME": account.name}


# ------------------------------------------------------------------------------- the system side

def lookup_account(name: str) -> Account | None:
    """The Unix account ``name`` with its supplementary groups, or None if the node has none."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        return None
    return Account(pw.pw_name, pw.pw_uid, pw.pw_gid, pw.pw_dir, tuple(os.getgrouplist(pw.pw_name, pw.pw_gid)))


def agent_account() -> Account:
    """The account this process runs as (a uid without a passwd entry is named by its number)."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        pw = pwd.getpwuid(uid)
        return Account(pw.pw_name, uid, gid, pw.pw_dir, tuple(os.getgroups()))
    except KeyError:
        return Account(str(uid), uid, gid, os.environ.get("HOME", "/"), tuple(os.getgroups()))
