"""Jobs of two real Unix users, started through the agent's own code path (RunStore, launcher,
subprocess), run as those users and cannot read or write each other's run, control or log
directories. Needs root (to create the users and to switch to them); skipped otherwise."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from unix_users import ATTEMPT, GROUP, USERS, group_gid, passable_tmp, probe, python_for_everyone, run_log
from waits import wait_for

from hfai.agent.plan import RunPhase
from hfai.agent.runs import RunStore
from hfai.protocol.types import DesiredRun, RunAssignment

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                                reason="needs root and useradd to create test users")

# The job: report who it is, then try the other job's directories (paths in its environment).
PROBE = r"""
import json, os, sys
""" + ATTEMPT + r"""
def write_suspend():
    with open(os.path.join(os.environ["OTHER_CONTROL"], "suspend"), "w") as f:
        f.write("forged")
def own_state():
    with open(os.path.join(os.environ["HFAI_CONTROL_DIR"], "whole_life_state"), "w") as f:
        f.write("5")
out = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
       "home": os.environ.get("HOME"), "user": os.environ.get("USER"), "cwd": os.getcwd()}
if os.environ.get("OTHER_CONTROL"):
    out["list_other_control"] = attempt(lambda: os.listdir(os.environ["OTHER_CONTROL"]))
    out["write_other_suspend"] = attempt(write_suspend)
    out["list_other_logs"] = attempt(lambda: os.listdir(os.path.dirname(os.environ["OTHER_LOG"])))
    out["read_other_log"] = attempt(lambda: open(os.environ["OTHER_LOG"]).read())
    out["list_runs"] = attempt(lambda: os.listdir(os.environ["RUNS_DIR"]))
    out["read_other_run"] = attempt(lambda: open(os.path.join(os.environ["OTHER_RUN"], "launch")).read())
    out["forge_exit_code"] = attempt(lambda: open(os.path.join(os.environ["HFAI_RUN_DIR"], "exit_code"), "w"))
    out["write_own_state"] = attempt(own_state)
print("PROBE " + json.dumps(out), flush=True)
if os.environ.get("LINGER"):
    import time
    time.sleep(float(os.environ["LINGER"]))
"""


@pytest.fixture()
def store():
    with passable_tmp("hfai-isolation-") as base:
        yield RunStore(base / "state", "n0", base / "envs", run_as="submitter")


def test_jobs_run_as_their_submitters_and_cannot_touch_each_other(users, store):
    b = _ra("jobb", USERS[1], env={"LINGER": "60"})
    store.start(b)
    try:
        wait_for(lambda: "PROBE" in run_log(store, b), 30, "jobb's probe", poll=0.05)
        a = _ra("joba", USERS[0], env={
            "OTHER_CONTROL": str(store.control_dir(b.key)), "OTHER_LOG": str(store.log_path("jobb", 0)),
            "RUNS_DIR": str(store.runs_dir), "OTHER_RUN": str(store.dir(b.key)),
            "HFAI_RUN_DIR": str(store.dir("joba.1")),
        })
        store.start(a)
        wait_for(lambda: store.snapshot()[a.key].phase is RunPhase.EXITED, 30, "joba to exit", poll=0.05)
        seen_a, seen_b = probe(store, a), probe(store, b)
    finally:
        store.signal(b.key, 9)
    for seen, user in ((seen_a, users[USERS[0]]), (seen_b, users[USERS[1]])):
        assert (seen["uid"], seen["euid"], seen["gid"]) == (user.pw_uid, user.pw_uid, user.pw_gid)
        assert seen["groups"] == sorted(os.getgrouplist(user.pw_name, user.pw_gid)) and 0 not in seen["groups"]
        assert (seen["home"], seen["user"]) == (user.pw_dir, user.pw_name)
    assert group_gid(GROUP) in seen_a["groups"]
    denied = ("list_other_control", "write_other_suspend", "list_other_logs", "read_other_log", "list_runs",
              "read_other_run", "forge_exit_code")
    assert {k: seen_a[k] for k in denied} == dict.fromkeys(denied, "PermissionError")
    assert not (store.control_dir(b.key) / "suspend").exists()
    assert seen_a["write_own_state"] == "ok" and store.whole_life_state(a.key) == 5
    assert store.snapshot()[a.key].exit_code == 0  # the launcher's record, not the job's
    _assert_modes(store, a, users[USERS[0]])


def test_a_job_enters_its_workdir_as_its_user(users, store):
    """The launcher enters the workdir with the job user's permissions (not root's): a directory
    of the user's own (0700) is fine, one the user may not enter is refused before anything runs."""
    user = users[USERS[0]]
    mine, private = store.root.parent / "mine", store.root.parent / "private"
    mine.mkdir(mode=0o700)
    os.chown(mine, user.pw_uid, user.pw_gid)
    private.mkdir(mode=0o700)  # root's
    ok = dataclasses.replace(_ra("jobw", USERS[0]), workdir=str(mine))
    refused = dataclasses.replace(_ra("jobv", USERS[0]), workdir=str(private))
    for ra in (ok, refused):
        store.start(ra)
    wait_for(lambda: all(store.snapshot()[ra.key].phase is RunPhase.EXITED for ra in (ok, refused)), 30,
             "both runs to exit", poll=0.05)
    assert store.snapshot()[ok.key].exit_code == 0 and probe(store, ok)["cwd"] == str(mine)
    assert store.snapshot()[refused.key].exit_code == 127
    assert f"cannot enter workdir {private}" in run_log(store, refused) and "PROBE" not in run_log(store, refused)


def test_a_user_unknown_on_the_node_never_runs(users, store):
    from hfai.agent.trust import StartError

    ra = _ra("jobx", "hfaitest_nosuch")
    with pytest.raises(StartError, match="no Unix account"):
        store.start(ra)
    assert store.snapshot()[ra.key].exit_code == 127 and not (store.dir(ra.key) / "launcher_pid").exists()


def _assert_modes(store: RunStore, ra: RunAssignment, user) -> None:
    def mode_owner(p: Path) -> tuple[int, int]:
        st = p.stat()
        return st.st_mode & 0o777, st.st_uid

    assert mode_owner(store.runs_dir) == (0o700, 0) and mode_owner(store.dir(ra.key)) == (0o700, 0)
    assert mode_owner(store.control_dir(ra.key)) == (0o700, user.pw_uid)
    assert mode_owner(store.log_path(ra.job_id, 0).parent) == (0o711, 0)
    assert mode_owner(store.log_path(ra.job_id, 0)) == (0o600, user.pw_uid)


def _ra(job_id: str, user: str, env: dict[str, str] | None = None) -> RunAssignment:
    return RunAssignment(job_id=job_id, run_id=1, name=job_id, user=user, group="default", priority=10, rank=0,
                         world_size=1, master_addr="127.0.0.1", master_port=20000,
                         entrypoint=(python_for_everyone(), "-c", PROBE), workdir="/", desired=DesiredRun.RUN,
                         env=env or {})
