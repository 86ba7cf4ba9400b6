"""Datasets as real Unix users: a private dataset is readable by jobs of its group only, a public
one by everyone, and neither is writable by any job. Jobs are started through the agent's own code
path (RunStore, launcher) as their submitters. Needs root (users, switching); skipped otherwise."""

from __future__ import annotations

import os
import shutil

import pytest
from unix_users import ATTEMPT, GROUP, USERS, passable_tmp, probe, python_for_everyone
from waits import wait_for

from hfai.agent.plan import RunPhase
from hfai.agent.runs import RunStore
from hfai.protocol.types import DesiredRun, RunAssignment
from hfai.storage import datasets

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd"),
                                reason="needs root and useradd to create test users")

PROBE = r"""
import json, os
root = os.environ["HFAI_DATASETS_DIR"]
""" + ATTEMPT + r"""
out = {}
for name in ("open", "secret"):
    out["read_" + name] = attempt(lambda: open(os.path.join(root, name, "part0")).read())
    out["write_" + name] = attempt(lambda: open(os.path.join(root, name, "part0"), "a").write("x"))
    out["create_" + name] = attempt(lambda: open(os.path.join(root, name, "new"), "w").write("x"))
print("PROBE " + json.dumps(out), flush=True)
"""


@pytest.fixture()
def base():
    with passable_tmp("hfai-datasets-") as d:
        yield d


def test_private_dataset_unreadable_to_another_group(users, base):
    root = base / "datasets"
    for name in ("open", "secret"):
        (base / "src" / name).mkdir(parents=True)
        (base / "src" / name / "part0").write_text(f"{name} data")
    (base / "src").chmod(0o755)
    assert datasets.add(str(root), "open", str(base / "src" / "open")).public
    secret = datasets.add(str(root), "secret", str(base / "src" / "secret"), group=GROUP)
    assert not secret.public and secret.group == GROUP
    assert [d.name for d in datasets.listing(str(root))] == ["open", "secret"]
    store = RunStore(base / "state", "n0", base / "envs", run_as="submitter", datasets_dir=str(root))
    seen = {}
    for i, user in enumerate(USERS):  # USERS[0] is in GROUP, USERS[1] is not
        ra = RunAssignment(job_id=f"ds{i}", run_id=1, name="probe", user=user, group="default", priority=10, rank=0,
                           world_size=1, master_addr="127.0.0.1", master_port=20000,
                           entrypoint=(python_for_everyone(), "-c", PROBE), workdir="/", desired=DesiredRun.RUN)
        store.start(ra)
        wait_for(lambda ra=ra: store.snapshot()[ra.key].phase is RunPhase.EXITED, 30, f"{ra.job_id} to exit", poll=0.05)
        seen[user] = probe(store, ra)
    member, other = seen[USERS[0]], seen[USERS[1]]
    assert member["read_open"] == other["read_open"] == "ok"
    assert member["read_secret"] == "ok"
    assert other["read_secret"] == "PermissionError"
    for who in (member, other):
        for name in ("open", "secret"):
            assert who[f"write_{name}"] == who[f"create_{name}"] == "PermissionError"
