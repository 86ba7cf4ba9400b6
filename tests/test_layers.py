"""The layer contract (pyproject.toml [tool.importlinter], run by tools/importlint.py in `make lint`):
the real tree keeps it, and a copy of the tree with one upward import breaks it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "importlint.py"

pytest.importorskip("importlinter")


def lint(root: Path | None = None) -> subprocess.CompletedProcess:
    args = ["--root", str(root)] if root is not None else []
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def copy(tmp_path) -> Path:
    """The repository's packages and pyproject.toml, copied (the tree the tool lays out is built from them)."""
    dirs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for folder in sorted({d.split("/")[0] for d in dirs.values()}):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def inject(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n{line}\n")


def test_the_tree_keeps_the_contract():
    r = lint()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


def test_the_protocol_importing_the_cli_breaks_the_layers(copy):
    inject(copy / "protocol" / "names.py", "from hfai.cli import render  # noqa: E402")
    r = lint(copy)
    assert r.returncode != 0
    assert "Layers: protocol < auth < core < api, kv < the consumers BROKEN" in r.stdout
    assert "The protocol imports nothing of hfai but itself BROKEN" in r.stdout
    assert "hfai.protocol.names -> hfai.cli.render" in r.stdout


def test_the_client_layer_importing_the_controller_breaks_the_layers(copy):
    inject(copy / "api" / "spec.py", "from hfai.controller import plan  # noqa: E402")
    r = lint(copy)
    assert r.returncode != 0
    assert "Layers: protocol < auth < core < api, kv < the consumers BROKEN" in r.stdout
    assert "hfai.api.spec -> hfai.controller.plan" in r.stdout


def test_auth_importing_the_nats_plumbing_breaks_the_layers(copy):
    # The cycle core/accounts.py ended: auth reads credentials for core, so it may not reach back into core.
    inject(copy / "auth" / "roles.py", "from hfai.core import nats  # noqa: E402")
    r = lint(copy)
    assert r.returncode != 0
    assert "Layers: protocol < auth < core < api, kv < the consumers BROKEN" in r.stdout
    assert "hfai.auth.roles -> hfai.core.nats" in r.stdout


def test_the_nats_plumbing_importing_the_client_layer_breaks_the_layers(copy):
    inject(copy / "core" / "retry.py", "from hfai.kv import cache  # noqa: E402")
    r = lint(copy)
    assert r.returncode != 0
    assert "Layers: protocol < auth < core < api, kv < the consumers BROKEN" in r.stdout
    assert "hfai.core.retry -> hfai.kv.cache" in r.stdout


def test_the_runtime_importing_the_cli_breaks_its_contract(copy):
    inject(copy / "runtime" / "experiment.py", "import hfai.cli.main  # noqa: E402")
    r = lint(copy)
    assert r.returncode != 0
    assert "The runtime and compat/ import no daemon nor the CLI BROKEN" in r.stdout
    assert "hfai.experiment -> hfai.cli.main" in r.stdout


def test_a_runtime_module_the_contract_does_not_name_is_refused(copy):
    (copy / "runtime" / "newthing.py").write_text('"""new"""\n')
    r = lint(copy)
    assert r.returncode == 2
    assert "add hfai.newthing to the source_modules" in r.stderr
