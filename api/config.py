"""Which cluster a client talks to, and as whom.

``cli_config`` finds the configuration every ``hfai`` command and :mod:`hfai.client` use; a
running ``hfai local`` cluster is found through its state file (:func:`read_local_state`), the
same file ``hfai.cli.local.LocalCluster`` writes, without importing the local cluster's code.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from hfai.core.config import Config, config_file, hfai_home, load_config
from hfai.protocol import names

#: The state file of a local cluster under its root: its NATS URL, pids and owner.
LOCAL_STATE_FILE = "cluster.json"
#: The config file a local cluster writes under its root.
LOCAL_CONFIG_FILE = "hfai.toml"


def local_root() -> Path:
    """Where ``hfai local`` keeps its cluster: ``$HFAI_HOME/local``."""
    return hfai_home() / "local"


def read_local_state(root: Path | None = None) -> dict[str, Any] | None:
    """The state file of the local cluster under ``root`` (default :func:`local_root`), or None
    when there is none (or it is not JSON: a cluster that never finished starting)."""
    try:
        data = json.loads(((root or local_root()) / LOCAL_STATE_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def current_user() -> str:
    """``$HFAI_USER``, else the login name as ``getpass.getuser()`` finds it (its environment
    variables, then the password database), without importing getpass and termios for it."""
    if user := os.environ.get("HFAI_USER"):
        return user
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if user := os.environ.get(name):
            return user
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def cli_config() -> Config:
    """Config for talking to the cluster, as every ``hfai`` command and :mod:`hfai.client` find it:
    HFAI_CONFIG / /etc/hfai/hfai.toml, else a running ``hfai local`` cluster, else defaults
    (``HFAI_NATS_URL`` overrides the URL in every case)."""
    if config_file() is not None:
        return load_config(None)
    root = local_root()
    return load_config(root / LOCAL_CONFIG_FILE if read_local_state(root) is not None else None)


def creds_dir(config: Config) -> Path:
    """Where users' credentials files are: ``[nats] creds_dir``, by default ``$HFAI_HOME/creds``."""
    return Path(config.nats.creds_dir or hfai_home() / "creds")


def creds_path(config: Config, user: str) -> Path:
    """The credentials file a CLI of ``user`` presents: ``[nats] creds`` if set, else
    ``<creds_dir>/<user>.creds`` (see :func:`creds_dir`)."""
    if config.nats.creds:
        return Path(config.nats.creds)
    return creds_dir(config) / f"{names.check_token('user name', user)}.creds"
