"""`hfai env` (issue 24 item 6, and item 11's empty listing): a job's interpreter in an environment
made by `hfai env create` can `import hfai`, and `hfai env list` names the hfai user who made it,
not the Unix account a local cluster runs everything as."""

from __future__ import annotations

import subprocess

import pytest
from click.testing import CliRunner

from hfai.cli.main import main


@pytest.fixture
def root(tmp_path):
    (tmp_path / "hfai.toml").write_text("")
    return tmp_path


def hfai(root, *args: str, user: str = "alice"):
    # No credentials file under HFAI_HOME: the CLI is HFAI_USER, as on a local cluster's first use.
    env = {"HFAI_CONFIG": str(root / "hfai.toml"), "HFAI_HOME": str(root / "home"), "HFAI_USER": user,
           "HFAI_AGENT_ENV_ROOT": str(root / "envs")}
    return CliRunner().invoke(main, ["env", *args], env=env)


def test_an_empty_env_list_says_none(root):
    r = hfai(root, "list")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("no environments") and "OWNER" not in r.output


def test_a_created_env_imports_hfai_and_is_its_maker_s(root):
    r = hfai(root, "create", "e1", "--no-pip")
    assert r.exit_code == 0, r.output
    python = root / "envs" / "e1" / "bin" / "python"
    # What the agent runs for `python` in a job with HF_ENV_NAME=e1 (agent/jobenv.py).
    probe = subprocess.run([str(python), "-c", "import hfai; print(hfai.receive_suspend_command(), hfai.__version__)"],
                           capture_output=True, text=True, timeout=60)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.split()[0] == "False"
    listed = hfai(root, "list")
    assert listed.exit_code == 0, listed.output
    row = listed.output.splitlines()[2].split()
    assert row[:2] == ["e1", "alice"]
    refused = hfai(root, "remove", "e1", user="bob")
    assert refused.exit_code != 0 and "belongs to alice" in refused.output
    assert (root / "envs" / "e1").is_dir()
    assert hfai(root, "remove", "e1").exit_code == 0
    assert not (root / "envs" / "e1").exists()
