"""Datasets: ``<dataset_root>/<name>`` on the shared filesystem, read-only to jobs by permissions.

Jobs run as their submitters (agent/identity.py), never as root, so a dataset owned by the
service's account (root in production) with no write bits for group and others is read-only to
every job. Public: readable by all (dirs 0755, files 0644). Private: owned by group ``G`` and
unreadable to others (dirs 0750, files 0640), so only jobs of users in ``G`` can read it.
The filesystem is the registry: ``list`` reads owner group and mode back.
"""

from __future__ import annotations

import grp
import os
import stat
from pathlib import Path

from hfai.protocol import names
from hfai.protocol.errors import InvalidRequest, NotFound
from hfai.protocol.storage import DatasetInfo


def modes(is_dir: bool, executable: bool, private: bool) -> int:
    """Permission bits of a dataset entry (pure)."""
    if is_dir or executable:
        return 0o750 if private else 0o755
    return 0o640 if private else 0o644


def add(root: str | os.PathLike, name: str, path: str, group: str = "") -> DatasetInfo:
    names.check_token("dataset name", name)
    src = Path(path)
    if not src.is_absolute() or not src.is_dir() or src.is_symlink():
        raise InvalidRequest(f"dataset path {path!r} must be an existing directory (an absolute path on the "
                             "shared filesystem, not a link)")
    gid = -1
    if group:
        names.check_token("group", group)
        try:
            gid = grp.getgrnam(group).gr_gid
        except KeyError:
            raise NotFound(f"no Unix group {group!r} on the storage service's host") from None
    uid = 0 if os.geteuid() == 0 else -1
    for dirpath, _dirs, files in os.walk(src):
        _fix(Path(dirpath), uid, gid, bool(group))
        for fn in files:
            _fix(Path(dirpath) / fn, uid, gid, bool(group))
    link = Path(root) / name
    Path(root).mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        if link.resolve() != src.resolve():
            raise InvalidRequest(f"dataset {name!r} already exists at {link.resolve()}")
    else:
        os.symlink(src, link)
    return info(root, name)


def _fix(p: Path, uid: int, gid: int, private: bool) -> None:
    st = os.lstat(p)
    if stat.S_ISLNK(st.st_mode):
        return
    if uid != -1 or gid != -1:
        try:
            os.chown(p, uid, gid, follow_symlinks=False)
        except PermissionError:
            raise InvalidRequest(f"the storage service may not give {p} to that group (run it as root)") from None
    os.chmod(p, modes(stat.S_ISDIR(st.st_mode), bool(st.st_mode & 0o111), private))


def info(root: str | os.PathLike, name: str) -> DatasetInfo:
    link = Path(root) / name
    try:
        st = os.stat(link)
    except OSError:
        raise NotFound(f"no dataset {name!r}") from None
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = str(st.st_gid)
    public = st.st_mode & 0o005 == 0o005
    return DatasetInfo(name=name, path=str(link), group="" if public else group, public=public)


def listing(root: str | os.PathLike) -> tuple[DatasetInfo, ...]:
    r = Path(root)
    if not r.is_dir():
        return ()
    out = []
    for p in sorted(r.iterdir()):
        if names.is_token(p.name):
            try:
                out.append(info(r, p.name))
            except NotFound:
                continue
    return tuple(out)
