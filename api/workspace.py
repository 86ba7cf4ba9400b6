"""The marker of a workspace (``.hfai/workspace.json``): which directory is one, and where a
pushed one lies on the cluster. Read by ``hfai workspace`` (storage's client), by ``hfai submit``
and by :mod:`hfai.client` (a job submitted from a pushed workspace runs in the cluster's copy)."""

from __future__ import annotations

import json
from pathlib import Path

from hfai._atomic import write_atomic
from hfai.protocol.errors import InvalidRequest

MARKER_DIR = ".hfai"
MARKER = "workspace.json"


def find_root(start: Path) -> Path | None:
    """The workspace (a directory with ``.hfai/workspace.json``) containing ``start``, if any."""
    for d in (start, *start.parents):
        if (d / MARKER_DIR / MARKER).is_file():
            return d
    return None


def read_marker(root: Path) -> dict:
    try:
        return json.loads((root / MARKER_DIR / MARKER).read_text())
    except (OSError, ValueError):
        raise InvalidRequest(f"{root} is not an hfai workspace; `hfai workspace init` it") from None


def write_marker(root: Path, data: dict) -> None:
    (root / MARKER_DIR).mkdir(exist_ok=True)
    write_atomic(root / MARKER_DIR / MARKER, json.dumps(data, indent=1))


def remote_workdir(cwd: Path) -> str | None:
    """Where ``cwd`` is on the cluster, if it lies in a pushed workspace (jobs run there)."""
    root = find_root(cwd)
    if root is None:
        return None
    remote = read_marker(root).get("remote")
    if not remote:
        return None
    rel = cwd.resolve().relative_to(root.resolve())
    return str(Path(remote) / rel) if str(rel) != "." else remote
