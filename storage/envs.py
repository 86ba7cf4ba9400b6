"""Environments (the original's ``haienv``): virtualenvs under ``[agent] env_root`` on the shared
filesystem, which every node's agent offers as ``HF_ENV_NAME=<name>`` (``hfai python -i NAME``).

Made by the user on a machine that mounts the shared filesystem; the directory is theirs, so only
they can change or remove it. The agent runs a job's ``python`` from ``<env_root>/<name>/bin``.

Every environment gets this machine's ``hfai`` distribution (its files, not its dependencies:
``import hfai`` is plain Python), so a job in it can follow the interrupt contract. Its owner is
the hfai user who made it, kept in ``<env>/hfai-env.json``: on a local cluster every user's files
belong to the one Unix account that runs it, so the directory's owner would name that account.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path, PurePath

from hfai.protocol import names
from hfai.protocol.errors import Forbidden, HfaiError, InvalidRequest, NotFound

log = logging.getLogger(__name__)

#: Who made an environment (the hfai user), next to the venv's own pyvenv.cfg.
OWNER_FILE = "hfai-env.json"


@dataclass(frozen=True)
class EnvInfo:
    name: str
    path: str
    owner: str
    python: str


def _dir(env_root: str, name: str) -> Path:
    return Path(env_root) / names.check_token("environment name", name)


def create(env_root: str, name: str, python: str = "", requirements: str = "", system_site: bool = False,
           pip: bool = True, timeout_s: float = 1800.0, owner: str = "") -> EnvInfo:
    """Make environment ``name`` for the hfai user ``owner`` (default: this Unix account's name)."""
    d = _dir(env_root, name)
    if d.exists():
        raise InvalidRequest(f"environment {name!r} already exists at {d}")
    exe = shutil.which(python) if python else sys.executable
    if not exe:
        raise NotFound(f"no Python {python!r} on this machine (give a path or a name on PATH)")
    if requirements and not Path(requirements).is_file():
        raise NotFound(f"no requirements file {requirements}")
    Path(env_root).mkdir(parents=True, exist_ok=True)
    if requirements and not pip:
        raise InvalidRequest("-r needs pip in the environment; drop --no-pip")
    cmd = [exe, "-m", "venv", *(["--system-site-packages"] if system_site else []),
           *([] if pip else ["--without-pip"]), str(d)]
    _run(cmd, "create the virtualenv", timeout_s, d)
    (d / OWNER_FILE).write_text(json.dumps({"owner": owner or pwd.getpwuid(os.geteuid()).pw_name}) + "\n")
    _add_hfai(d, timeout_s)
    if requirements:
        _run([str(d / "bin" / "python"), "-m", "pip", "install", "-r", requirements], "install the requirements",
             timeout_s, d)
    return info(env_root, name)


def _run(cmd: list[str], what: str, timeout_s: float, d: Path) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        shutil.rmtree(d, ignore_errors=True)
        raise HfaiError(f"could not {what} within {timeout_s:g}s") from None
    if done.returncode != 0:
        shutil.rmtree(d, ignore_errors=True)
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise HfaiError(f"could not {what}: {tail[0]}")


def _add_hfai(d: Path, timeout_s: float) -> None:
    """Copy this machine's installed ``hfai`` distribution (package files and metadata, not its
    console scripts) into the new environment's site-packages. An editable install copies as its
    path hook, so the environment follows the source tree like this interpreter does."""
    # The installed copy (pip writes its RECORD), not the source tree's egg-info that the current
    # directory may put first on sys.path.
    dist = next((x for x in importlib.metadata.distributions(name="hfai") if x.read_text("RECORD")), None)
    if dist is None:
        log.warning("hfai is not installed as a package here: environment %s cannot `import hfai`", d.name)
        return
    done = subprocess.run([str(d / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0 or not done.stdout.strip():
        shutil.rmtree(d, ignore_errors=True)
        raise HfaiError(f"could not find the new environment's site-packages: {done.stderr.strip()[-200:]}")
    site = Path(done.stdout.strip())
    for rel in dist.files or ():
        parts = PurePath(rel).parts
        if not parts or parts[0] == ".." or "__pycache__" in parts:
            continue  # console scripts live outside site-packages; bytecode is rebuilt
        src = Path(str(dist.locate_file(rel)))
        if src.is_file():
            (site / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, site / rel)


def _owner(d: Path) -> str:
    """The hfai user who made environment ``d``; for one made before owners were kept, the Unix
    owner of its directory."""
    try:
        owner = json.loads((d / OWNER_FILE).read_text()).get("owner")
        if isinstance(owner, str) and names.is_token(owner):
            return owner
    except (OSError, ValueError, AttributeError):
        pass  # no owner file that names one (an environment made before they were kept): see below
    try:
        return pwd.getpwuid(d.stat().st_uid).pw_name
    except KeyError:
        return str(d.stat().st_uid)


def info(env_root: str, name: str) -> EnvInfo:
    d = _dir(env_root, name)
    if not (d / "bin").is_dir():
        raise NotFound(f"no environment {name!r} in {env_root}")
    owner = _owner(d)
    cfg = d / "pyvenv.cfg"
    version = ""
    if cfg.is_file():
        for line in cfg.read_text().splitlines():
            if line.startswith("version"):
                version = line.split("=", 1)[1].strip()
    return EnvInfo(name=name, path=str(d), owner=owner, python=version)


def listing(env_root: str) -> list[EnvInfo]:
    root = Path(env_root)
    if not root.is_dir():
        return []
    return [info(env_root, p.name) for p in sorted(root.iterdir()) if names.is_token(p.name) and (p / "bin").is_dir()]


def remove(env_root: str, name: str, user: str = "", operator: bool = False) -> EnvInfo:
    """Delete environment ``name`` of the hfai user ``user`` (operators: anyone's)."""
    e = info(env_root, name)
    theirs = bool(user) and e.owner != user and not operator
    if theirs or (os.geteuid() != 0 and Path(e.path).stat().st_uid != os.geteuid()):
        raise Forbidden(f"environment {name!r} belongs to {e.owner}; you can only remove your own")
    shutil.rmtree(e.path)
    return e
