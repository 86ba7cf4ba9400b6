"""GC of workspaces (the I/O side of :func:`hfai.storage.plan.gc_moves` and ``gc_expired``).

Files untouched for ``gc_age_s`` move from ``<workspace_root>/<user>/<ws>/<rel>`` to
``<gc_root>/<user>/<stamp>/<ws>/<rel>`` (``stamp``: the epoch second of the move; the user can
fetch them back from there), and a stamp directory older than ``gc_keep_s`` is deleted. The time
is a parameter, so tests inject it instead of sleeping.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from hfai.protocol import names
from hfai.storage import plan
from hfai.storage.workspace import Workspaces

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GcResult:
    moved: tuple[str, ...] = ()     # "<user>/<ws>/<rel>"
    deleted: tuple[str, ...] = ()   # "<user>/<stamp>"


def entries(ws: Path, depth: int = plan.GC_DEPTH) -> list[plan.Entry]:
    """What GC sees of one workspace: files at levels 1..depth, directories at level ``depth``
    with the newest mtime of anything in them (links are not followed)."""
    out: list[plan.Entry] = []

    def visit(d: Path, level: int) -> None:
        with os.scandir(d) as it:
            for e in it:
                st = e.stat(follow_symlinks=False)
                rel = str((d / e.name).relative_to(ws))
                if stat.S_ISDIR(st.st_mode):
                    if level < depth:
                        visit(d / e.name, level + 1)
                    else:
                        out.append(plan.Entry(rel, True, level, newest_mtime(d / e.name, st.st_mtime)))
                else:
                    out.append(plan.Entry(rel, False, level, st.st_mtime))

    visit(ws, 1)
    return out


def newest_mtime(path: Path, own: float) -> float:
    newest = own
    for dirpath, dirs, files in os.walk(path):
        for name in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(dirpath, name)).st_mtime)
            except OSError:
                pass  # gone since the walk listed it: it makes nothing newer
    return newest


def run_gc(workspaces: Workspaces, gc_root: str | os.PathLike, now: float, age_s: float, keep_s: float) -> GcResult:
    gc = Path(gc_root)
    moved, deleted = [], []
    stamp = str(int(now))
    for user in workspaces.users():
        # Names starting with '.' are no workspaces (a commit's tree being assembled, for one).
        for ws in sorted(p for p in (workspaces.root / user).iterdir()
                         if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")):
            rels = plan.gc_moves(entries(ws), now, age_s)
            for rel in rels:
                dest = gc / user / stamp / ws.name / rel
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.chmod(gc / user, 0o700)
                shutil.move(str(ws / rel), str(dest))
                moved.append(f"{user}/{ws.name}/{rel}")
            if rels:
                workspaces.forget(user, ws.name, rels)
        user_gc = gc / user
        if user_gc.is_dir() and names.is_token(user):
            for old in plan.gc_expired((p.name for p in user_gc.iterdir() if p.is_dir()), now, keep_s):
                shutil.rmtree(user_gc / old, ignore_errors=True)
                deleted.append(f"{user}/{old}")
    if moved or deleted:
        log.info("gc: moved %d path(s), deleted %d old gc entr(ies)", len(moved), len(deleted))
    return GcResult(tuple(moved), tuple(deleted))
