"""The user guide's first command on a fresh local cluster (issue 40): the cluster's base
environment by its stock name, ``HF_ENV_NAME=py38-202111 hfai python sample.py -- -n 1 --name
test_202111``, run as written in a shell; the job runs in the local cluster's interpreter, its log
says which environment it got, and a script's ``hf_env.set_env('202111')`` agrees. Operators (and
only they) add base environments, from the CLI with real credentials. One cluster for the module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
from spine_cluster import Cluster, cli_env

from hfai import base_envs
from hfai.protocol.types import ChainState

pytestmark = pytest.mark.slow

GUIDE = "HF_ENV_NAME=py38-202111 hfai python sample.py -- -n 1 --name test_202111"

SAMPLE = """
    import sys, warnings
    import hf_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a stock name the cluster does not know would warn
        print("SET_ENV", hf_env.set_env("202111"), flush=True)
    print("PREFIX", sys.prefix, flush=True)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with Cluster(tmp_path_factory.mktemp("baseenvs"), nodes=1) as c:
        yield c


def test_the_user_guide_s_first_command_runs_as_written(cluster, tmp_path):
    (tmp_path / "sample.py").write_text(textwrap.dedent(SAMPLE))
    cluster.creds("tester")
    env = cli_env(cluster) | {"PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    r = subprocess.run(["bash", "-c", GUIDE], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "submitted job test_202111" in r.stdout
    (base,) = base_envs.load(cluster.local.root / "envs")
    assert base.name == base_envs.base_name(sys.version_info[:2], base.name[-6:])
    assert base.aliases == ("py38-202111", "202111") and base.python_exe == sys.executable
    job = cluster.wait_state("test_202111", ChainState.SUCCEEDED)
    log = cluster.log(job.id)
    assert f"environment {base.name}, asked as py38-202111" in log
    assert f"PREFIX {sys.prefix}" in log and f"SET_ENV {sys.prefix}" in log


def test_env_list_shows_the_local_base_environment(cluster, tmp_path):
    r = cluster.cli("env", "list", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "base environments (read-only, for everyone):"
    assert lines[2].split()[1:4] == [sys.version.split()[0], "py38-202111,", "202111"]
    assert "torch " in lines[2] and "hfai " in lines[2]


def test_only_operators_add_base_environments(cluster, tmp_path):
    name = base_envs.base_name(sys.version_info[:2], "203001")
    refused = cluster.cli("env", "base", "add", name, sys.prefix, "--alias", "stock", cwd=tmp_path)
    assert refused.returncode == 1 and refused.stderr.count("\n") == 1
    assert refused.stderr.startswith("Error: only operators add base environments (you are tester)")
    added = cluster.cli("env", "base", "add", name, sys.prefix, "--alias", "stock", cwd=tmp_path, user="root")
    assert added.returncode == 0, added.stderr
    assert base_envs.resolve(cluster.local.root / "envs", "stock").name == name
    taken = cluster.cli("env", "create", "stock", "--no-pip", cwd=tmp_path)
    assert taken.returncode == 1 and "names the base environment" in taken.stderr
    assert cluster.cli("env", "base", "remove", name, cwd=tmp_path, user="root").returncode == 0
    assert base_envs.resolve(cluster.local.root / "envs", "stock") is None
