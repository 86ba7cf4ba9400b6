"""Environments (the original's ``haienv``): virtualenvs under ``[agent] env_root`` on the shared
filesystem, which every node's agent offers as ``HF_ENV_NAME=<name>`` (``hfai python -i NAME``).

Made by the user on a machine that mounts the shared filesystem; the directory is theirs, so only
they can change or remove it. The agent runs a job's ``python`` from ``<env_root>/<name>/bin``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from hfai.protocol import names
from hfai.protocol.errors import Forbidden, HfaiError, InvalidRequest, NotFound


@dataclass(frozen=True)
class EnvInfo:
    name: str
    path: str
    owner: str
    python: str


def _dir(env_root: str, name: str) -> Path:
    return Path(env_root) / names.check_token("environment name", name)


def create(env_root: str, name: str, python: str = "", requirements: str = "", system_site: bool = False,
           pip: bool = True, timeout_s: float = 1800.0) -> EnvInfo:
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


def info(env_root: str, name: str) -> EnvInfo:
    d = _dir(env_root, name)
    if not (d / "bin").is_dir():
        raise NotFound(f"no environment {name!r} in {env_root}")
    try:
        owner = pwd.getpwuid(d.stat().st_uid).pw_name
    except KeyError:
        owner = str(d.stat().st_uid)
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


def remove(env_root: str, name: str) -> EnvInfo:
    e = info(env_root, name)
    if os.geteuid() != 0 and Path(e.path).stat().st_uid != os.geteuid():
        raise Forbidden(f"environment {name!r} belongs to {e.owner}; you can only remove your own")
    shutil.rmtree(e.path)
    return e
