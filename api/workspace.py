"""The marker of a workspace (``.hfai/workspace.json``): which directory is one, and where a
pushed one lies on the cluster. Read by ``hfai workspace`` (storage's client), by ``hfai submit``
and by :mod:`hfai.client` (a job submitted from a pushed workspace runs in the cluster's copy)."""

from __future__ import annotations

import json
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Marker:
    """``.hfai/workspace.json``: the workspace's name, and where its last push put it on the
    cluster with when ("" and 0 before one). A JSON object of these keys (no version; others are
    ignored)."""

    name: str
    remote: str = ""
    pushed_ts: float = 0.0

    @classmethod
    def parse(cls, text: str, where: Path | str = MARKER) -> Marker:
        try:
            data = json_object(text, where)
        except ValueError as e:
            raise InvalidRequest(f"{e}; `hfai workspace init` again") from None
        name, remote, ts = data.get("name"), data.get("remote") or "", data.get("pushed_ts") or 0
        if not (isinstance(name, str) and name and isinstance(remote, str) and isinstance(ts, int | float)
                and not isinstance(ts, bool)):
            raise InvalidRequest(f"{where}: not a workspace marker (a name, and where and when it was "
                                 "pushed); `hfai workspace init` again")
        return cls(name, remote, float(ts))

    def text(self) -> str:
        data: dict[str, object] = {"name": self.name}
        if self.remote:
            data |= {"remote": self.remote, "pushed_ts": self.pushed_ts}
        return json.dumps(data, indent=1)


def json_object(text: str, where: Path | str) -> dict:
    """``text`` as a JSON object; ValueError naming ``where`` and what is wrong if it is not one."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{where}: not JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: not a JSON object")
    return data


def read_marker(root: Path) -> Marker:
    """The marker of the workspace at ``root``; InvalidRequest, saying what to do, if there is
    none or it is not one."""
    where = root / MARKER_DIR / MARKER
    try:
        text = where.read_text()
    except (OSError, ValueError):
        raise InvalidRequest(f"{root} is not an hfai workspace; `hfai workspace init` it") from None
    return Marker.parse(text, where)


def write_marker(root: Path, marker: Marker) -> None:
    (root / MARKER_DIR).mkdir(exist_ok=True)
    write_atomic(root / MARKER_DIR / MARKER, marker.text())


def remote_workdir(cwd: Path) -> str | None:
    """Where ``cwd`` is on the cluster, if it lies in a pushed workspace (jobs run there)."""
    root = find_root(cwd)
    if root is None:
        return None
    remote = read_marker(root).remote
    if not remote:
        return None
    rel = cwd.resolve().relative_to(root.resolve())
    return str(Path(remote) / rel) if str(rel) != "." else remote
