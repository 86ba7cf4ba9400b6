"""`hfai env` (issue 24 item 6, and item 11's empty listing): a job's interpreter in an environment
made by `hfai env create` can `import hfai`, and `hfai env list` names the hfai user who made it,
not the Unix account a local cluster runs everything as. And the cluster's base environments
(issue 40): the alias table, who may add one, what clashes, `hfai env list`, an unknown name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hfai import base_envs
from hfai.cli.main import main
from hfai.protocol.errors import Forbidden, InvalidRequest
from hfai.storage import envs


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


# ------------------------------------------------------------------- base environments (issue 40)

#: This interpreter's base environment name, as a local cluster registers it this month.
HERE = base_envs.base_name(sys.version_info[:2], "202612")
OTHER_PY = (3, 6) if sys.version_info[:2] != (3, 6) else (3, 7)


def _probed(prefix: str = sys.prefix, version: tuple[int, int] = sys.version_info[:2]) -> envs.Probed:
    """What probing an interpreter answers, without running one (the real probe: the CLI test below)."""
    return envs.Probed(python_exe=f"{prefix}/bin/python", version=f"{version[0]}.{version[1]}.0", prefix=prefix,
                       site=(f"{prefix}/lib/python{version[0]}.{version[1]}/site-packages",),
                       packages={"torch": "2.1.0", "numpy": "1.26.0"})


def test_the_alias_table_resolves_names_and_aliases_to_the_base_environment(root):
    env_root = str(root / "envs")
    envs.add_base(env_root, HERE, sys.prefix, ("py38-202111", "202111"), operator=True, user="ops", probed=_probed())
    (root / "envs" / "mine" / "bin").mkdir(parents=True)
    for asked in (HERE, "py38-202111", "202111"):
        got = base_envs.resolve(env_root, asked)
        assert got is not None and got.base and got.name == HERE and got.asked == asked
        assert got.python_exe == f"{sys.prefix}/bin/python"
    assert base_envs.resolve(env_root, "py38-202111").describe == f"base environment {HERE}, asked as py38-202111"
    user = base_envs.resolve(env_root, "mine")
    assert user is not None and not user.base and user.path == str(root / "envs" / "mine")
    assert base_envs.resolve(env_root, "nope") is None
    assert base_envs.offered(env_root) == tuple(sorted({HERE, "py38-202111", "202111", "mine"}))
    # The table is for everyone to read, and nobody else's to write.
    assert (root / "envs" / base_envs.TABLE).stat().st_mode & 0o777 == 0o644
    # Replacing an interpreter keeps the name; an alias moves only when asked to.
    with pytest.raises(InvalidRequest, match="already names the base environment"):
        envs.add_base(env_root, base_envs.base_name(sys.version_info[:2], "202701"), sys.prefix, ("202111",),
                      operator=True, probed=_probed())
    newer = base_envs.base_name(sys.version_info[:2], "202701")
    envs.add_base(env_root, newer, sys.prefix, ("202111",), operator=True, probed=_probed(), take_aliases=True)
    assert base_envs.resolve(env_root, "202111").name == newer
    assert base_envs.resolve(env_root, "py38-202111").name == HERE


def test_base_environment_names_say_their_python(root):
    env_root = str(root / "envs")
    for bad in ("202111", "py38-2021", "python38-202111", "py38-202113"):
        with pytest.raises(InvalidRequest, match="py<major><minor>-<YYYYMM>"):
            envs.add_base(env_root, bad, sys.prefix, operator=True, probed=_probed())
    wrong = base_envs.base_name(OTHER_PY, "202612")
    with pytest.raises(InvalidRequest, match=f"name it {HERE}"):
        envs.add_base(env_root, wrong, sys.prefix, operator=True, probed=_probed())
    assert base_envs.load(env_root) == ()


def test_refusals_a_non_operator_and_aliases_that_clash_with_users_environments(root):
    env_root = str(root / "envs")
    with pytest.raises(Forbidden, match="only operators add base environments"):
        envs.add_base(env_root, HERE, sys.prefix, operator=False, user="alice", probed=_probed())
    (root / "envs" / "py38-202111" / "bin").mkdir(parents=True)  # alice's own, made before
    with pytest.raises(InvalidRequest, match="'py38-202111' is already a user's environment"):
        envs.add_base(env_root, HERE, sys.prefix, ("py38-202111",), operator=True, probed=_probed())
    assert base_envs.load(env_root) == ()
    envs.add_base(env_root, HERE, sys.prefix, ("202111",), operator=True, probed=_probed())
    # And the other way round: a user's new environment may not take a base environment's name.
    for taken in (HERE, "202111"):
        r = hfai(root, "create", taken, "--no-pip")
        assert r.exit_code == 1 and "names the base environment" in r.output, r.output
        assert r.output.count("\n") == 1
        assert not (root / "envs" / taken).exists()
    r = hfai(root, "remove", "202111")
    assert r.exit_code == 1 and "is a base environment" in r.output


def test_a_non_operator_cannot_add_a_base_environment_from_the_cli(root):
    r = hfai(root, "base", "add", HERE, sys.prefix, "--alias", "py38-202111")
    assert r.exit_code == 1
    assert r.output == "Error: only operators add base environments (you are alice); make your own with " \
                       "hfai env create NAME\n"
    assert not (root / "envs" / base_envs.TABLE).exists()
    r = hfai(root, "base", "remove", HERE)
    assert r.exit_code == 1 and r.output.startswith("Error: only operators remove base environments")


def test_env_list_shows_base_environments_first_then_the_user_s_own(root, monkeypatch):
    import hfai.cli.env as cli_env

    monkeypatch.setattr(cli_env, "_me", lambda: ("ops", True))  # an operator's credentials
    added = hfai(root, "base", "add", HERE, sys.executable, "--alias", "py38-202111", "--alias", "202111")
    assert added.exit_code == 0, added.output
    assert f"base environment {HERE} (also py38-202111, 202111): Python {sys.version.split()[0]}" in added.output
    monkeypatch.setattr(cli_env, "_me", lambda: ("alice", False))
    assert hfai(root, "create", "e1", "--no-pip").exit_code == 0
    monkeypatch.setattr(cli_env, "_me", lambda: ("bob", False))
    assert hfai(root, "create", "e2", "--no-pip").exit_code == 0
    monkeypatch.setattr(cli_env, "_me", lambda: ("alice", False))
    lines = hfai(root, "list").output.splitlines()
    assert lines[0] == "base environments (read-only, for everyone):"
    assert lines[1].split() == ["NAME", "PYTHON", "ALIASES", "PACKAGES"]
    row = lines[2].split(None, 3)
    assert row[:3] == [HERE, sys.version.split()[0], "py38-202111,"] and row[3].startswith("202111 ")
    import numpy
    import torch

    assert f"torch {torch.__version__}, numpy {numpy.__version__}, hfai " in lines[2]
    assert lines[3] == "your environments:"
    assert lines[5].split()[:2] == ["e1", "alice"]
    assert lines[6] == "other users' environments:"
    assert lines[8].split()[:2] == ["e2", "bob"]
    table = json.loads((root / "envs" / base_envs.TABLE).read_text())
    assert table["base"][0]["python_exe"] == sys.executable and table["base"][0]["added_by"] == "ops"


def test_a_table_somebody_else_could_have_written_is_ignored(root, caplog):
    env_root = root / "envs"
    envs.add_base(str(env_root), HERE, sys.prefix, ("202111",), operator=True, probed=_probed())
    assert base_envs.resolve(env_root, "202111") is not None
    (env_root / base_envs.TABLE).chmod(0o666)
    assert base_envs.resolve(env_root, "202111") is None and base_envs.load(env_root) == ()
    assert "others may write it" in caplog.text


def test_an_unknown_environment_is_one_line_naming_base_and_own_environments(root, tmp_path, monkeypatch):
    """Refused before anything is sent (no cluster here to send it to), on a line of its own."""
    envs.add_base(str(root / "envs"), HERE, sys.prefix, ("py38-202111",), operator=True, probed=_probed())
    envs.create(str(root / "envs"), "mine", pip=False, owner="alice")
    envs.create(str(root / "envs"), "bobs", pip=False, owner="bob")
    (tmp_path / "sample.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    env = {"HFAI_CONFIG": str(root / "hfai.toml"), "HFAI_HOME": str(root / "home"), "HFAI_USER": "alice",
           "HFAI_AGENT_ENV_ROOT": str(root / "envs"), "HF_ENV_NAME": "py38-202112",
           "HFAI_NATS_URL": "nats://127.0.0.1:1"}
    r = CliRunner().invoke(main, ["python", "sample.py", "--", "-n", "1"], env=env)
    assert r.exit_code == 1
    assert r.output == (f"Error: unknown environment HF_ENV_NAME='py38-202112'; base environments: {HERE} "
                        "(also py38-202111); yours: mine (see hfai env list)\n")


def _assignment(tmp_path, env_name: str):
    from hfai.protocol.types import DesiredRun, RunAssignment

    return RunAssignment(job_id="j1", run_id=1, name="n", user="u", group="default", priority=10, rank=0,
                         world_size=1, master_addr="a", master_port=1, entrypoint=("python", "sample.py"),
                         workdir=str(tmp_path), desired=DesiredRun.RUN, env_name=env_name)


def test_a_job_asking_by_alias_runs_the_base_environment_s_python(root, tmp_path):
    from hfai.agent.identity import JobIdentity, agent_account
    from hfai.agent.jobenv import env_note, job_command
    from hfai.agent.trust import StartError

    env_root = root / "envs"
    envs.add_base(str(env_root), HERE, sys.prefix, ("py38-202111",), operator=True, probed=_probed())
    who = JobIdentity(agent_account(), switch=False)
    argv, env = job_command(_assignment(tmp_path, "py38-202111"), who, node="n0", control_dir=str(tmp_path / "c"),
                            run_as="submitter", env_root=env_root)
    assert argv == [f"{sys.prefix}/bin/python", "sample.py"]
    assert env["PATH"].split(":")[0] == f"{sys.prefix}/bin" and env["HF_ENV_NAME"] == "py38-202111"
    assert env_note(_assignment(tmp_path, "py38-202111"), env_root) == \
        f"base environment {HERE}, asked as py38-202111"
    with pytest.raises(StartError) as e:
        job_command(_assignment(tmp_path, "py38-202112"), who, node="n0", control_dir=str(tmp_path / "c"),
                    run_as="submitter", env_root=env_root)
    assert "\n" not in str(e.value) and f"base environments: {HERE} (also py38-202111)" in str(e.value)


def test_inside_a_container_base_environments_are_bound_read_only(root, tmp_path):
    from hfai.agent.cgroup import CgroupKind, CgroupSetup
    from hfai.agent.contain import Containment
    from hfai.agent.identity import JobIdentity, agent_account
    from hfai.agent.sandbox import BindMode, ContainerPaths, plan_mounts

    prefix = tmp_path / "opt" / "py"  # a base environment no job's own interpreter lies in
    (prefix / "bin").mkdir(parents=True)
    env_root = root / "envs"
    envs.add_base(str(env_root), HERE, str(prefix), ("202111",), operator=True, probed=_probed(str(prefix)))
    seen: list[ContainerPaths] = []

    class Recorder:
        name = "bwrap"

        def wrap(self, argv, paths):
            seen.append(paths)
            return argv

    c = Containment(sandbox=Recorder(), cgroups=CgroupSetup(CgroupKind.NONE))
    c.wrap(_assignment(tmp_path, ""), JobIdentity(agent_account(), switch=False), ["python"], {}, str(tmp_path),
           "agent", sys.executable, str(env_root))
    mounts = {(m.mode, m.dst) for m in plan_mounts(seen[0])}
    assert (BindMode.RO, str(prefix)) in mounts and (BindMode.RO, str(env_root)) in mounts
