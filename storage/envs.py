"""Environments (the original's ``haienv``): virtualenvs under ``[agent] env_root`` on the shared
filesystem, which every node's agent offers as ``HF_ENV_NAME=<name>`` (``hfai python -i NAME``),
beside the cluster's base environments (hfai.base_envs: operators' interpreters with the stock
packages, added here by :func:`add_base`).

Made by the user on a machine that mounts the shared filesystem; the directory is theirs, so only
they can change or remove it. The agent runs a job's ``python`` from ``<env_root>/<name>/bin``.

Every environment gets this machine's ``hfai`` distribution (its files, not its dependencies:
``import hfai`` is plain Python), so a job in it can follow the interrupt contract. Its owner is
the hfai user who made it, kept in ``<env>/hfai-env.json``: on a local cluster every user's files
belong to the one Unix account that runs it, so the directory's owner would name that account.
"""

from __future__ import annotations

import dataclasses
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

from hfai import base_envs
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
    taken = base_envs.find(base_envs.load(env_root), name)
    if taken is not None:
        raise InvalidRequest(f"{name!r} names the base environment {taken.label}; give yours another name")
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
    if base_envs.find(base_envs.load(env_root), name) is not None:
        raise InvalidRequest(f"{name!r} is a base environment (read-only, for everyone); operators remove it with "
                             f"hfai env base remove")
    e = info(env_root, name)
    theirs = bool(user) and e.owner != user and not operator
    if theirs or (os.geteuid() != 0 and Path(e.path).stat().st_uid != os.geteuid()):
        raise Forbidden(f"environment {name!r} belongs to {e.owner}; you can only remove your own")
    shutil.rmtree(e.path)
    return e


# ---------------------------------------------------------------------------- base environments

#: What :func:`probe` runs in an interpreter: its version, prefix, site-packages and main packages.
_PROBE = """
import importlib.metadata as m, json, sys, sysconfig
pk = {}
for n in sys.argv[1:]:
    try:
        pk[n] = m.version(n)
    except Exception:
        pass
print(json.dumps({"version": ".".join(map(str, sys.version_info[:3])), "prefix": sys.prefix, "packages": pk,
                  "site": sorted({sysconfig.get_path("purelib"), sysconfig.get_path("platlib")})}))
"""


@dataclass(frozen=True)
class Probed:
    python_exe: str
    version: str
    prefix: str
    site: tuple[str, ...]
    packages: dict[str, str]

    @property
    def major_minor(self) -> tuple[int, int]:
        major, minor = self.version.split(".")[:2]
        return int(major), int(minor)


def probe(path: str, timeout_s: float = 120.0) -> Probed:
    """The interpreter ``path`` (a python executable, or a prefix with ``bin/python3``): NotFound
    if there is none, HfaiError if it does not run."""
    p = Path(path)
    exe = next((c for c in (p, p / "bin" / "python3", p / "bin" / "python") if c.is_file() and os.access(c, os.X_OK)),
               None)
    if exe is None or not p.is_absolute():
        raise NotFound(f"no Python interpreter at {path} (give an absolute path: a prefix with bin/python3, or "
                       "the interpreter itself)")
    try:
        # From /, so that a source tree in the current directory cannot stand in for the
        # interpreter's own packages.
        done = subprocess.run([str(exe), "-c", _PROBE, *base_envs.MAIN_PACKAGES], capture_output=True, text=True,
                              timeout=timeout_s, cwd="/")
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HfaiError(f"could not run {exe}: {e}") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise HfaiError(f"could not run {exe}: {tail[0]}")
    got = json.loads(done.stdout)
    return Probed(python_exe=str(exe), version=got["version"], prefix=got["prefix"], site=tuple(got["site"]),
                  packages=dict(got["packages"]))


def add_base(env_root: str, name: str, path: str, aliases: tuple[str, ...] = (), *, operator: bool, user: str = "",
             take_aliases: bool = False, probed: Probed | None = None) -> base_envs.BaseEnv:
    """Make the interpreter at ``path`` base environment ``name`` with ``aliases`` (operators only).
    A name already there is replaced (the operator installed a new interpreter for it). An alias
    of another base environment is refused, or with ``take_aliases`` moved here; a name or alias
    that is a user's environment is always refused: it would hide theirs."""
    if not operator:
        raise Forbidden(f"only operators add base environments (you are {user or 'not one'}); "
                        "make your own with hfai env create NAME")
    version = base_envs.check_base_name(name)
    aliases = tuple(dict.fromkeys(a for a in aliases if a != name))
    for a in aliases:
        names.check_token("alias", a)
    for n in (name, *aliases):
        if (Path(env_root) / n).exists():
            raise InvalidRequest(f"{n!r} is already a user's environment ({Path(env_root) / n}); "
                                 "choose another name or alias")
    got = probed or probe(path)
    if got.major_minor != version:
        raise InvalidRequest(f"{name} says Python {version[0]}.{version[1]} but {got.python_exe} is Python "
                             f"{got.version}; name it {base_envs.base_name(got.major_minor, name[-6:])}")
    table = [b for b in base_envs.load(env_root) if b.name != name]
    for b in table:
        clash = set(b.names) & {name, *aliases}
        if clash and (name in clash or not take_aliases):
            raise InvalidRequest(f"{', '.join(sorted(clash))} already names the base environment {b.label}")
    table = [dataclasses.replace(b, aliases=tuple(a for a in b.aliases if a not in aliases)) for b in table]
    new = base_envs.BaseEnv(name=name, path=got.prefix, python_exe=got.python_exe, python=got.version,
                            aliases=aliases, packages=got.packages, site=got.site, added_by=user)
    Path(env_root).mkdir(parents=True, exist_ok=True)
    base_envs.save(env_root, sorted([*table, new], key=lambda b: b.name))
    return new


def remove_base(env_root: str, name: str, *, operator: bool, user: str = "") -> base_envs.BaseEnv:
    """Take base environment ``name`` (its own name, not an alias) off the table (operators only);
    its interpreter stays where it is."""
    if not operator:
        raise Forbidden(f"only operators remove base environments (you are {user or 'not one'})")
    table = list(base_envs.load(env_root))
    gone = next((b for b in table if b.name == name), None)
    if gone is None:
        raise NotFound(f"no base environment {name!r} ({base_envs.known(env_root)})")
    base_envs.save(env_root, [b for b in table if b is not gone])
    return gone


def register_local(env_root: str, python_exe: str, yyyymm: str, aliases: tuple[str, ...]) -> base_envs.BaseEnv:
    """A local cluster's own interpreter as a base environment (``hfai local up``): kept as it is
    if already there, else named for this month and given ``aliases`` (taken from an older one)."""
    got = probe(python_exe)
    for b in base_envs.load(env_root):
        if b.python_exe == got.python_exe and b.python == got.version:
            if b.packages == got.packages and b.site == got.site:
                return b
            return add_base(env_root, b.name, python_exe, b.aliases, operator=True, user=b.added_by,
                            take_aliases=True, probed=got)
    free = tuple(a for a in aliases if not (Path(env_root) / a).exists())
    return add_base(env_root, base_envs.base_name(got.major_minor, yyyymm), python_exe, free, operator=True,
                    user="hfai local up", take_aliases=True, probed=got)
