"""Rough edges of the CLI found in use (issue 13), through the real CLI against a local cluster."""

from __future__ import annotations

import pytest

from hfai.protocol.types import ChainState
from spine_cluster import JOBS, Cluster

STEPS = str(JOBS / "steps.py")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("usability"), nodes=2) as c:
        yield c


def _job_id(stdout: str) -> str:
    return stdout.split("(")[1].split(")")[0]


@pytest.mark.parametrize("args, name, printed", [
    (["submit", "-n", "1", "bash", "-c", "echo hi from bash"], "bash", "hi from bash"),
    (["submit", "-n", "1", "python", "-c", "print('hi from python')"], "python", "hi from python"),
    (["python", "-c", "print('hi via hfai python')", "--", "-n", "1"], "python", "hi via hfai python"),
])
def test_inline_programs_need_no_script_file(cluster, tmp_path, args, name, printed):
    r = cluster.cli(*args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    job = cluster.wait_state(_job_id(r.stdout), ChainState.SUCCEEDED)
    assert job.spec.name == name and printed in cluster.log(job.id)


def test_a_missing_script_after_interpreter_options_is_still_refused(cluster, tmp_path):
    r = cluster.cli("submit", "python", "-u", "no_such_train.py", cwd=tmp_path)
    assert r.returncode != 0 and "'no_such_train.py' does not exist" in r.stderr and "Traceback" not in r.stderr
