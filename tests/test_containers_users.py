"""Compute containers as production runs them: an agent running as root starts each job as its
submitter (a real Unix user), who then runs bwrap without privileges (a user namespace). Through
the agent's own code path (RunStore, launcher), as tests/test_agent_isolation_users.py does for
bare processes. Needs root and useradd; skipped otherwise."""

from __future__ import annotations

import dataclasses
import os
import shutil

import pytest
from unix_users import ATTEMPT, USERS, passable_tmp, probe, python_for_everyone
from waits import wait_for

from hfai.agent.contain import make_containment, reachable
from hfai.agent.plan import RunPhase
from hfai.agent.runs import RunStore
from hfai.core.config import AgentConfig
from hfai.protocol.types import DesiredRun, RunAssignment

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                                reason="needs root and useradd to create test users")

PROBE = r"""
import json, os
""" + ATTEMPT + r"""
out = {"uid": os.getuid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
       "home": os.environ["HOME"], "control": os.environ["HFAI_CONTROL_DIR"],
       "read_state": attempt(lambda: os.listdir(os.environ["STATE_DIR"])),
       "write_tmp": attempt(lambda: open("/tmp/x", "w").write("x")),
       "write_control": attempt(lambda: open(os.path.join(os.environ["HFAI_CONTROL_DIR"], "whole_life_state"),
                                            "w").write("7"))}
print("PROBE " + json.dumps(out), flush=True)
"""


@pytest.fixture(scope="module")
def users():
    from unix_users import create_users

    yield from create_users()


def _ra(job_id: str, user: str, env: dict[str, str], workdir: str) -> RunAssignment:
    return RunAssignment(job_id=job_id, run_id=1, name=job_id, user=user, group="default", priority=10, rank=0,
                         world_size=1, master_addr="127.0.0.1", master_port=20000,
                         entrypoint=(python_for_everyone(), "-c", PROBE), workdir=workdir, desired=DesiredRun.RUN,
                         env=env)


def test_a_submitters_job_runs_in_an_unprivileged_container(users):
    ac = dataclasses.replace(AgentConfig(), run_as="submitter", cgroup_name="hfai-test-users")
    with passable_tmp("hfai-contained-") as base:
        containment = make_containment(ac, "n0", str(base / "ws"), "", "", 8 * 2**30)
        assert containment.sandbox.name == "bwrap", containment.summary
        store = RunStore(base / "state", "n0", base / "envs", run_as="submitter", containment=containment)
        work = base / "work"
        work.mkdir()
        os.chown(work, users[USERS[0]].pw_uid, users[USERS[0]].pw_gid)
        ra = _ra("jobc", USERS[0], {"STATE_DIR": str(store.root)}, str(work))
        store.start(ra)
        wait_for(lambda: store.snapshot()[ra.key].phase is RunPhase.EXITED, 30, "the job to exit", poll=0.05)
        seen = probe(store, ra)
        assert store.snapshot()[ra.key].exit_code == 0
        assert store.whole_life_state(ra.key) == 7  # its control directory, bound read-write inside
    assert seen["uid"] == users[USERS[0]].pw_uid
    assert len(seen["pids"]) <= 3, seen  # its container's pid 1, itself
    assert seen["home"] == f"/home/{USERS[0]}" and seen["control"] == "/run/hfai/control"
    assert seen["read_state"] == "FileNotFoundError"  # the agent's state is not in its container
    assert seen["write_tmp"] == "ok" and seen["write_control"] == "ok"


def test_reachable_follows_the_kernels_owner_group_other_choice():
    with passable_tmp("hfai-reach-") as base:  # 0711 under /tmp: others may pass through
        d = base / "d"
        d.mkdir()
        os.chown(d, 0, 4242)
        d.chmod(0o750)
        assert reachable(str(d), 0, ())  # the owner: rwx
        assert reachable(str(d), 1234, (4242,))  # the group: r-x
        assert not reachable(str(d), 1234, ())  # others: nothing
        base.chmod(0o700)
        assert not reachable(str(d), 1234, (4242,))  # a parent others may not pass
