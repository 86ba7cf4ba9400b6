"""``hf_env.set_env(NAME)`` / ``hfai_env.set_env(NAME)`` against real virtualenv directories laid
out as ``hfai env create`` makes them (``python -m venv --without-pip``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture(scope="module")
def env_root(tmp_path_factory) -> Path:
    """An environment root holding 'hdmn' (a real venv with a package and a .pth file in it) and
    'old' (made for another Python)."""
    root = tmp_path_factory.mktemp("envs")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "hdmn")], check=True, timeout=120)
    site = root / "hdmn" / "lib" / VERSION / "site-packages"
    (site / "only_in_hdmn.py").write_text("WHERE = 'hdmn'\n")
    extra = root / "extra"
    extra.mkdir()
    (extra / "via_pth.py").write_text("OK = True\n")
    (site / "extra.pth").write_text(f"{extra}\n")  # an editable install looks like this
    (root / "old" / "bin").mkdir(parents=True)
    (root / "old" / "lib" / "python3.6" / "site-packages").mkdir(parents=True)
    return root


def _python(code: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith("HFAI_") and k not in ("VIRTUAL_ENV", "HF_ENV_NAME")}
    e.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=e,
                          cwd=cwd, timeout=120)


_CHILD = """
    import multiprocessing as mp, os, sys
    import hf_env, hfai_env
    assert hfai_env.set_env is hf_env.set_env

    def child(q):
        import only_in_hdmn
        q.put(only_in_hdmn.WHERE)

    if __name__ == "__main__":
        got = hf_env.set_env("hdmn")
        import only_in_hdmn, via_pth
        site = next(i for i, p in enumerate(sys.path) if p.endswith("hdmn/lib/{version}/site-packages"))
        base = next(i for i, p in enumerate(sys.path) if p.startswith(sys.prefix) and p.endswith("site-packages"))
        q = mp.get_context("spawn").Queue()
        p = mp.get_context("spawn").Process(target=child, args=(q,))
        p.start()
        print(got.name, only_in_hdmn.WHERE, via_pth.OK, site < base, q.get(timeout=60),
              os.environ["HF_ENV_NAME"], os.environ["VIRTUAL_ENV"] == str(got),
              os.environ["PATH"].split(os.pathsep)[0] == str(got / "bin"))
        p.join()
"""


def test_an_existing_environment_is_activated_for_the_rest_of_the_process(env_root, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(_CHILD.replace("{version}", VERSION)))
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=120,
                       env={**{k: v for k, v in os.environ.items() if not k.startswith("HFAI_")},
                            "HFAI_ENV_ROOT": str(env_root)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["hdmn", "hdmn", "True", "True", "hdmn", "hdmn", "True", "True"]


def test_already_in_the_environment_nothing_changes(env_root, tmp_path):
    r = _python("""
        import sys, hfai_env
        before = list(sys.path)
        print(hfai_env.set_env("hdmn").name, sys.path == before)
    """, tmp_path, HFAI_ENV_ROOT=str(env_root), VIRTUAL_ENV=str(env_root / "hdmn"))
    assert r.returncode == 0 and r.stdout.split() == ["hdmn", "True"], r.stderr


@pytest.mark.parametrize("in_job", [False, True])
def test_a_missing_stock_environment_warns_and_goes_on(env_root, tmp_path, in_job):
    extra = {"HFAI_CONTROL_DIR": str(tmp_path)} if in_job else {}
    r = _python("""
        import sys, hf_env
        before = list(sys.path)
        print(hf_env.set_env("202111"), sys.path == before)
    """, tmp_path, HFAI_ENV_ROOT=str(env_root), **extra)
    assert r.returncode == 0 and r.stdout.split() == ["None", "True"], r.stderr
    assert "EnvSwitchWarning" in r.stderr and "'202111'" in r.stderr and "stock packages" in r.stderr


def test_a_missing_named_environment_fails_in_a_job_and_warns_off_the_platform(env_root, tmp_path):
    code = """
        import hf_env
        try:
            print(hf_env.set_env("nosuch"))
        except hf_env.EnvironmentNotFound as e:
            print("refused:", e)
    """
    r = _python(code, tmp_path, HFAI_ENV_ROOT=str(env_root), HFAI_CONTROL_DIR=str(tmp_path))
    assert r.returncode == 0 and r.stdout.startswith("refused:"), r.stderr
    assert "hfai env create nosuch" in r.stdout and "hdmn" in r.stdout and "old" in r.stdout
    r = _python(code, tmp_path, HFAI_ENV_ROOT=str(env_root))
    assert r.returncode == 0 and r.stdout.split() == ["None"] and "off the platform" in r.stderr, r.stderr


def test_an_environment_for_another_python_is_refused(env_root, tmp_path, monkeypatch):
    import hf_env

    monkeypatch.setenv("HFAI_ENV_ROOT", str(env_root))
    before = list(sys.path)
    with pytest.raises(hf_env.EnvironmentMismatch, match=r"python3\.6.*HF_ENV_NAME=old"):
        hf_env.set_env("old")
    assert sys.path == before
    with pytest.raises(TypeError, match="environment name"):
        hf_env.set_env("../etc")


# ------------------------------------------------------------------- base environments (issue 40)

HERE = f"py{sys.version_info.major}{sys.version_info.minor}-202612"


@pytest.fixture
def base_root(tmp_path, env_root) -> Path:
    """A root whose base environment is this interpreter (as a local cluster registers it), aliased
    as the stock names, and another whose base environment is the venv 'hdmn' (really probed)."""
    from hfai.storage import envs

    root = tmp_path / "base"
    root.mkdir()
    envs.add_base(str(root), HERE, sys.executable, ("py38-202111", "202111"), operator=True)
    other = tmp_path / "other"
    other.mkdir()
    envs.add_base(str(other), HERE, str(env_root / "hdmn"), ("py38-202111",), operator=True)
    return tmp_path


@pytest.mark.parametrize("module", ["hf_env", "hfai_env"])
@pytest.mark.parametrize("asked", ["202111", "py38-202111", HERE])
def test_set_env_resolves_base_environments_by_name_and_alias(base_root, tmp_path, module, asked):
    """``set_env('202111')`` in a script agrees with ``HF_ENV_NAME=py38-202111`` at submission: the
    base environment the job already runs in, nothing to switch and nothing to warn of."""
    r = _python(f"""
        import sys, warnings, {module}
        warnings.simplefilter("error")
        before = list(sys.path)
        print({module}.set_env({asked!r}) == __import__("pathlib").Path(sys.prefix), sys.path == before)
    """, tmp_path, HFAI_ENV_ROOT=str(base_root / "base"), HFAI_CONTROL_DIR=str(tmp_path))
    assert r.returncode == 0 and r.stdout.split() == ["True", "True"], r.stderr
    assert "Warning" not in r.stderr


def test_set_env_switches_into_another_base_environment_of_this_python(base_root, env_root, tmp_path):
    r = _python("""
        import os, sys, hf_env
        got = hf_env.set_env("py38-202111")
        import only_in_hdmn
        print(got.name, only_in_hdmn.WHERE, os.environ["HF_ENV_NAME"], os.environ["PATH"].split(os.pathsep)[0])
    """, tmp_path, HFAI_ENV_ROOT=str(base_root / "other"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["hdmn", "hdmn", "py38-202111", str(env_root / "hdmn" / "bin")]


def test_a_missing_name_in_a_job_names_the_base_environments(base_root, tmp_path):
    r = _python("""
        import hf_env
        try:
            hf_env.set_env("nosuch")
        except hf_env.EnvironmentNotFound as e:
            print("refused:", e)
    """, tmp_path, HFAI_ENV_ROOT=str(base_root / "base"), HFAI_CONTROL_DIR=str(tmp_path))
    assert r.returncode == 0 and r.stdout.startswith("refused:"), r.stderr
    assert f"base environments: {HERE} (also py38-202111, 202111)" in r.stdout
