"""Real Unix users for the tests that run jobs as their submitters (they need root): the two test
users and their group, the Python they may run, and the probe jobs' shared code and output."""

from __future__ import annotations

import contextlib
import grp
import json
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from hfai.agent.runs import RunStore
from hfai.protocol.types import RunAssignment

USERS = ("hfaitest_a", "hfaitest_b")
GROUP = "hfaitest_g"  # a supplementary group of hfaitest_a

# Probe jobs' code: the name of the OSError an action raised, or "ok".
ATTEMPT = r"""
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return type(e).__name__
"""


def create_users():
    """Create the test users and group where missing; yields ``{name: pwd entry}``, then removes
    what it created."""
    created_group = _ensure(["groupadd", "--system", GROUP], lambda: group_gid(GROUP) is not None)
    created = []
    for name in USERS:
        if _ensure(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    name], lambda name=name: _user_exists(name)):
            created.append(name)
    subprocess.run(["usermod", "-a", "-G", GROUP, USERS[0]], check=True, capture_output=True)
    try:
        yield {name: pwd.getpwnam(name) for name in USERS}
    finally:
        for name in created:
            subprocess.run(["userdel", name], check=False, capture_output=True)
        if created_group:
            subprocess.run(["groupdel", GROUP], check=False, capture_output=True)


@contextlib.contextmanager
def passable_tmp(prefix: str):
    """A fresh directory under /tmp (not pytest's tmp_path: job users must pass through every parent
    directory), mode 0711, removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o711)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def python_for_everyone() -> str:
    """A Python the test users may run (the test's own may live under root's 0700 home)."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        real = Path(candidate).resolve()
        if real.is_file() and all(p.stat().st_mode & 0o001 for p in (real, *real.parents)):
            return str(real)
    pytest.skip("no Python on this machine that other users may run")


def run_log(store: RunStore, ra: RunAssignment) -> str:
    return store.log_path(ra.job_id, ra.rank).read_text(errors="replace")


def probe(store: RunStore, ra: RunAssignment) -> dict:
    """What a probe job printed on its ``PROBE {json}`` line."""
    text = run_log(store, ra)
    line = next((ln for ln in text.splitlines() if ln.startswith("PROBE ")), None)
    assert line, f"the job printed no probe; its log:\n{text}"
    return json.loads(line[len("PROBE "):])


def group_gid(name: str) -> int | None:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def _ensure(cmd: list[str], exists) -> bool:
    """Run ``cmd`` unless ``exists()``; True if this call created the thing (and must remove it)."""
    if exists():
        return False
    subprocess.run(cmd, check=True, capture_output=True)
    return True


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False
