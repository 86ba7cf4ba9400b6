"""``hf_env.set_env(NAME)`` / ``hfai_env.set_env(NAME)``: switch a running script to an environment.

Environments are the cluster's base environments (interpreters with the stock packages, named
``py311-202612`` and by aliases such as ``py38-202111`` or ``202111``: :mod:`hfai.base_envs`) and
the virtualenvs ``hfai env create NAME`` makes under the nodes' environment root (``[agent]
env_root``; see docs/storage.md). A name resolves as ``HF_ENV_NAME=NAME`` does at submission,
aliases included. The best way to use one is to start the job in it (``HF_ENV_NAME=NAME hfai
python ...`` or ``-i NAME``): then its own ``python`` runs. Scripts
written for Fire-Flyer instead call ``hf_env.set_env('202111')`` at the top; this does what
activating the environment would do for the rest of the process:

* **found** (``<env_root>/NAME`` with a ``lib/pythonX.Y/site-packages`` of this interpreter's
  version): its site-packages (``.pth`` files included) go before the interpreter's own on
  ``sys.path``, its ``bin`` first on ``PATH``, ``VIRTUAL_ENV`` and ``HF_ENV_NAME`` are set, so
  modules imported from now on and processes started from now on (``multiprocessing`` spawn
  workers, ``python`` subprocesses) see it. Modules imported before the call stay as they are.
  Already running in it (``VIRTUAL_ENV`` is that directory): nothing to do.
* **a base environment**: already running in it (the job was started with it, as every job
  without HF_ENV_NAME on a local cluster is): nothing to do. Else, as above, its site-packages
  first on ``sys.path`` and its ``bin`` first on ``PATH`` (``VIRTUAL_ENV`` only for a virtualenv).
* **found, but for another Python version**: :class:`EnvironmentMismatch` (its compiled packages
  would not load here); start the job in it instead.
* **not found, a stock name** (six digits, the cluster's dated environments such as ``202111``,
  ``202207``, that no base environment has as an alias): a warning, and the script goes on in the
  current interpreter, which is where this platform's stock packages are.
* **not found, another name**: in a job on the platform (``HFAI_CONTROL_DIR`` set)
  :class:`EnvironmentNotFound`, naming the environments there and ``hfai env create``; off the
  platform a warning, and the script goes on in the interpreter the user started.

The root is ``$HFAI_ENV_ROOT`` if set, else ``[agent] env_root`` of the cluster's config.
"""

from __future__ import annotations

import os
import re
import site
import sys
import warnings
from pathlib import Path

from hfai import base_envs
from hfai.protocol.errors import HfaiError, NotFound

ROOT_ENV = "HFAI_ENV_ROOT"
_STOCK = re.compile(r"^\d{6}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class EnvironmentNotFound(NotFound):
    """``set_env(NAME)`` in a job, and there is no environment NAME."""


class EnvironmentMismatch(HfaiError):
    """The environment was made for another Python version than the one running."""

    code = "invalid"


class EnvSwitchWarning(UserWarning):
    """``set_env`` went on without switching."""


def env_root() -> Path | None:
    """Where environments live: ``$HFAI_ENV_ROOT``, else the config's ``[agent] env_root``."""
    raw = os.environ.get(ROOT_ENV)
    if raw:
        return Path(raw)
    from hfai.core.config import load_config

    try:
        return Path(load_config().agent.env_root)
    except (HfaiError, OSError, ValueError):
        return None


def is_stock(name: str) -> bool:
    """The cluster's dated environments ('202105', '202111', '202207', ...)."""
    return bool(_STOCK.match(name))


def set_env(name: str) -> Path | None:
    """Switch this process to environment ``name`` (see the module doc for every case); returns
    the environment's directory, or None where the script goes on unchanged."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise TypeError(f"set_env takes an environment name (letters, digits, '.', '_', '-'), got {name!r}")
    root = env_root()
    got = base_envs.resolve(root, name)
    if got is None:
        _missing(name, root)
        return None
    if got.base:
        return _activate_base(name, got)
    return _activate(name, Path(got.path))


def _missing(name: str, root: Path | None) -> None:
    where = f"in {root}" if root is not None else "(no environment root configured)"
    if is_stock(name):
        warnings.warn(f"hf_env.set_env({name!r}): no environment {name!r} {where}; going on with this "
                      f"interpreter ({sys.prefix}), which holds this platform's stock packages",
                      EnvSwitchWarning, stacklevel=3)
        return
    if os.environ.get("HFAI_CONTROL_DIR"):
        raise EnvironmentNotFound(
            f"hf_env.set_env({name!r}): no environment {name!r} {where} ({base_envs.known(root)}); "
            f"create it with `hfai env create {name} -r requirements.txt`, or drop the call")
    warnings.warn(f"hf_env.set_env({name!r}): no environment {name!r} {where}; off the platform the script "
                  f"goes on with this interpreter ({sys.prefix})", EnvSwitchWarning, stacklevel=3)


def _activate(name: str, env_dir: Path) -> Path:
    if Path(os.environ.get("VIRTUAL_ENV") or sys.prefix).resolve() == env_dir.resolve():
        return env_dir
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_dir = env_dir / "lib" / version / "site-packages"
    if not site_dir.is_dir():
        made_for = sorted(p.parent.name for p in env_dir.glob("lib/python*/site-packages"))
        raise EnvironmentMismatch(
            f"hf_env.set_env({name!r}): {env_dir} is for {', '.join(made_for) or 'no known Python'}, this is "
            f"{version}; start the job in it instead (HF_ENV_NAME={name} hfai python ..., or -i {name})")
    _prepend_site(str(site_dir))
    os.environ["PATH"] = f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["VIRTUAL_ENV"] = str(env_dir)
    os.environ["HF_ENV_NAME"] = name
    return env_dir


def _activate_base(name: str, got: base_envs.Resolved) -> Path:
    prefix = Path(got.path)
    if Path(sys.prefix).resolve() == prefix.resolve():
        return prefix
    b = base_envs.find(base_envs.load(env_root()), got.name)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if b is None or ".".join(b.python.split(".")[:2]) != here:
        raise EnvironmentMismatch(
            f"hf_env.set_env({name!r}): the base environment {got.name} is Python {b.python if b else '?'}, this is "
            f"{here}; start the job in it instead (HF_ENV_NAME={name} hfai python ...)")
    for site_dir in reversed(b.site):
        _prepend_site(site_dir)
    os.environ["PATH"] = f"{got.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    if (prefix / "pyvenv.cfg").is_file():
        os.environ["VIRTUAL_ENV"] = str(prefix)
    os.environ["HF_ENV_NAME"] = name
    return prefix


def _prepend_site(site_dir: str) -> None:
    """``site.addsitedir`` (which runs the directory's ``.pth`` files), with what it added moved in
    front of the interpreter's own site-packages, as in the environment's own interpreter."""
    before = list(sys.path)
    site.addsitedir(site_dir)
    added = [p for p in sys.path if p not in before]
    first_site = next((i for i, p in enumerate(before) if p.endswith(("site-packages", "dist-packages"))),
                      len(before))
    sys.path[:] = before[:first_site] + added + before[first_site:]
