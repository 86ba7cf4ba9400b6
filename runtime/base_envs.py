"""The cluster's base environments and how an environment name resolves (``HF_ENV_NAME=NAME``,
``-i NAME``, ``hf_env.set_env(NAME)``).

A **base environment** is an interpreter with the platform's stock packages (torch, numpy, hfai,
what the operator installs), read-only and for everyone. It is named as the original names them,
``py<major><minor>-<YYYYMM>`` (``py311-202612``), and may have further names, aliases, for the
stock names old scripts carry (``py38-202111``, ``202111``). Operators add them with
``hfai env base add``; a local cluster registers its own interpreter at ``hfai local up``.

The table of base environments is one JSON file in the environment root, ``<env_root>/.base-envs.json``
(its leading dot keeps it out of the users' names). The interpreters themselves stay where the
operator installed them. A name resolves to a base environment (its name or an alias) first, else
to the user environment ``<env_root>/<name>`` (``hfai env create``); the two never share a name
(both commands refuse a clash).

Whoever reads the table trusts it only if it was written by root, by this account, or by the
owner of the environment root, and nobody else may write it: the root is shared, so a table a
user planted there must not send other users' jobs to an interpreter of that user's choosing.

Part of the runtime (``hfai.base_envs``): a job's ``hf_env.set_env`` reads it as the agent does.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hfai.protocol import names
from hfai.protocol.errors import InvalidRequest

log = logging.getLogger(__name__)

#: The table's file name in the environment root.
TABLE = ".base-envs.json"
#: The platform's main packages, whose versions `hfai env list` shows.
MAIN_PACKAGES = ("torch", "numpy", "hfai")

_BASE_NAME = re.compile(r"^py(\d)(\d{1,2})-(\d{4})(0[1-9]|1[0-2])$")


@dataclass(frozen=True)
class BaseEnv:
    """One base environment: its interpreter (``python_exe``, under ``path``, its prefix)."""

    name: str
    path: str
    python_exe: str
    python: str  # its version, "3.11.4"
    aliases: tuple[str, ...] = ()
    packages: dict[str, str] = field(default_factory=dict)  # MAIN_PACKAGES' versions
    site: tuple[str, ...] = ()  # its site-packages folders (hf_env.set_env puts them on sys.path)
    added_by: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def label(self) -> str:
        """``py311-202612 (also py38-202111, 202111)``."""
        return f"{self.name} (also {', '.join(self.aliases)})" if self.aliases else self.name


@dataclass(frozen=True)
class Resolved:
    """What an environment name stands for: ``name`` (the environment's own) asked as ``asked``."""

    name: str
    asked: str
    path: str  # the prefix: a base environment's interpreter prefix, a user environment's folder
    python_exe: str
    base: bool

    @property
    def bin_dir(self) -> str:
        return os.path.dirname(self.python_exe)

    @property
    def describe(self) -> str:
        """What a job's log says: ``environment py311-202612, asked as py38-202111``."""
        kind = "environment" if not self.base else "base environment"
        return f"{kind} {self.name}" + (f", asked as {self.asked}" if self.asked != self.name else "")


def check_base_name(name: str) -> tuple[int, int]:
    """The (major, minor) Python version a base environment's name says; InvalidRequest unless it
    is ``py<major><minor>-<YYYYMM>``."""
    m = _BASE_NAME.match(name or "")
    if not m:
        raise InvalidRequest(f"a base environment is named py<major><minor>-<YYYYMM> (py311-202612), not {name!r}; "
                             "give other names as --alias")
    return int(m.group(1)), int(m.group(2))


def base_name(version: tuple[int, int], yyyymm: str) -> str:
    """The name of a base environment of Python ``version`` made in month ``yyyymm``."""
    return f"py{version[0]}{version[1]}-{yyyymm}"


def table_path(root: str | os.PathLike) -> Path:
    return Path(root) / TABLE


def load(root: str | os.PathLike | None) -> tuple[BaseEnv, ...]:
    """The base environments of environment root ``root`` (none without a trusted table)."""
    if root is None:
        return ()
    path = table_path(root)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return ()
    except OSError as e:
        log.warning("cannot read the base environments' table %s: %s", path, e)
        return ()
    with open(fd, "rb") as f:
        why = _untrusted(os.fstat(f.fileno()), Path(root))
        if why:
            _warn_once(f"ignoring the base environments' table {path}: {why}")
            return ()
        raw = f.read()
    try:
        entries = json.loads(raw).get("base", [])
        return tuple(_entry(e) for e in entries)
    except (ValueError, TypeError, AttributeError, KeyError) as e:
        _warn_once(f"ignoring the base environments' table {path}: not a table ({e})")
        return ()


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """A table is read at every heartbeat: say what is wrong with it once per process."""
    if message not in _warned:
        _warned.add(message)
        log.warning("%s", message)


def _untrusted(st: os.stat_result, root: Path) -> str:
    """Why a table with stat ``st`` in ``root`` is not to be trusted ("" if it is)."""
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_mode & 0o022:
        return f"others may write it (mode {stat.S_IMODE(st.st_mode):o})"
    try:
        root_owner = root.stat().st_uid
    except OSError:
        root_owner = 0
    if st.st_uid not in (0, os.geteuid(), root_owner):
        return f"written by uid {st.st_uid}, neither root nor the owner of {root}"
    return ""


def _entry(e: dict) -> BaseEnv:
    aliases = tuple(str(a) for a in e.get("aliases", ()))
    check_base_name(e["name"])
    for n in aliases:
        names.check_token("alias", n)
    return BaseEnv(name=e["name"], path=str(e["path"]), python_exe=str(e["python_exe"]), python=str(e["python"]),
                   aliases=aliases, packages={str(k): str(v) for k, v in dict(e.get("packages", {})).items()},
                   site=tuple(str(s) for s in e.get("site", ())), added_by=str(e.get("added_by", "")))


def save(root: str | os.PathLike, table: tuple[BaseEnv, ...] | list[BaseEnv]) -> None:
    """Write ``table`` as the base environments of ``root`` (readable by all, writable by its writer)."""
    from hfai._atomic import write_atomic

    data = {"base": [asdict(b) | {"aliases": list(b.aliases), "site": list(b.site)} for b in table]}
    path = table_path(root)
    write_atomic(path, json.dumps(data, indent=1, sort_keys=True) + "\n", mode=0o644)
    os.chmod(path, 0o644)  # whatever the umask: every node's agent and every job reads it


def find(table: tuple[BaseEnv, ...] | list[BaseEnv], name: str) -> BaseEnv | None:
    """The base environment named or aliased ``name``."""
    return next((b for b in table if name in b.names), None)


def user_names(root: str | os.PathLike | None) -> list[str]:
    """The user environments (``hfai env create``) of ``root``: folders with a ``bin``."""
    if root is None or not Path(root).is_dir():
        return []
    return sorted(p.name for p in Path(root).iterdir() if names.is_token(p.name) and (p / "bin").is_dir())


def offered(root: str | os.PathLike | None) -> tuple[str, ...]:
    """Every name a job may ask for: base environments' names and aliases, users' environments."""
    out = set(user_names(root))
    for b in load(root):
        out.update(b.names)
    return tuple(sorted(out))


def resolve(root: str | os.PathLike | None, name: str) -> Resolved | None:
    """What ``name`` stands for in environment root ``root`` (None: nothing)."""
    if root is None or not names.is_token(name):
        return None
    b = find(load(root), name)
    if b is not None:
        return Resolved(name=b.name, asked=name, path=b.path, python_exe=b.python_exe, base=True)
    d = Path(root) / name
    if (d / "bin").is_dir():
        return Resolved(name=name, asked=name, path=str(d), python_exe=str(d / "bin" / "python"), base=False)
    return None


def known(root: str | os.PathLike | None, mine: set[str] | None = None) -> str:
    """The environments there, in one line: base ones (with aliases) first, then users' (only
    those in ``mine`` if given)."""
    base = "; ".join(b.label for b in load(root)) or "none"
    users = [n for n in user_names(root) if mine is None or n in mine]
    whose = "yours" if mine is not None else "users'"
    return f"base environments: {base}; {whose}: {', '.join(users) or 'none'}"
