"""The storage service's decisions, as pure functions (the I/O lives in commit.py, gc.py, service.py
and client.py).

Nothing here touches a file or NATS: given manifests, usage figures, listings and the time, each
function says what to do, so every rule is tested table-driven.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hfai.protocol.errors import InvalidRequest
from hfai.protocol.storage import FileEntry, Manifest
from hfai.protocol.types import RestrictedUsers

# A workspace name: a path token (it becomes a directory name).
_WS_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")
# What the storage rules write as the reason; only restrictions with this prefix are theirs to lift.
STORAGE_REASON = "storage:"


def check_workspace_name(name: str) -> str:
    if not _WS_NAME.match(name or "") or name in (".", ".."):
        raise InvalidRequest(f"workspace name {name[:80]!r} may only use letters, digits, '_', '.' and '-' "
                             "(1-64 chars, not starting with '.' or '-')")
    return name


def check_manifest(m: Manifest, chunk_bytes: int) -> None:
    """Refuse a manifest whose paths could leave the workspace or whose chunks cannot add up."""
    seen: set[str] = set()
    for f in m.files:
        parts = f.path.split("/")
        if not f.path or f.path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in f.path:
            raise InvalidRequest(f"manifest path {f.path[:80]!r} is not a relative path inside the workspace")
        if f.path in seen:
            raise InvalidRequest(f"manifest lists {f.path[:80]!r} twice")
        seen.add(f.path)
        if f.size < 0 or len(f.chunks) != chunk_count(f.size, chunk_bytes):
            raise InvalidRequest(f"manifest entry {f.path[:80]!r}: {len(f.chunks)} chunks do not make "
                                 f"{f.size} bytes in chunks of {chunk_bytes}")
    dirs = {"/".join(p.split("/")[:i]) for p in seen for i in range(1, p.count("/") + 1)}
    clash = dirs & seen
    if clash:
        raise InvalidRequest(f"manifest has {sorted(clash)[0]!r} both as a file and as a directory")


def manifest_digest(m: Manifest) -> str:
    """What names a manifest for :data:`hfai.protocol.storage.VERB_WS_CURRENT`: the SHA-256 of its
    encoding, which is also the file the service records it in (so it digests that file's bytes)."""
    from hfai.protocol import encode

    return digest_bytes(encode(m))


def digest_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def up_to_date(m: Manifest, present: Mapping[str, int]) -> bool:
    """Whether every file ``m`` lists is on disk at its size (``present``: path -> size)."""
    return all(present.get(f.path) == f.size for f in m.files)


def chunk_count(size: int, chunk_bytes: int) -> int:
    return 0 if size == 0 else (size + chunk_bytes - 1) // chunk_bytes


def missing(wanted: Iterable[str], held: set[str]) -> tuple[str, ...]:
    """The chunks of ``wanted`` the cluster does not hold, in first-seen order, without repeats."""
    out: dict[str, None] = {}
    for h in wanted:
        if h not in held:
            out.setdefault(h)
    return tuple(out)


@dataclass(frozen=True)
class CommitPlan:
    write: tuple[FileEntry, ...]     # files to (re)write
    chmod: tuple[FileEntry, ...]     # same content, other permission bits
    delete: tuple[str, ...]          # files to remove (in the old manifest, not in the new)


def commit_plan(old: Manifest | None, new: Manifest, present: Mapping[str, int]) -> CommitPlan:
    """How to turn the workspace from ``old`` into ``new``. ``present``: path -> size of the files
    on disk now (one that vanished or changed size, e.g. moved by GC, is written again)."""
    before = {f.path: f for f in (old.files if old else ())}
    write, chmod = [], []
    for f in new.files:
        was = before.get(f.path)
        if was is None or was.chunks != f.chunks or present.get(f.path) != f.size:
            write.append(f)
        elif was.mode != f.mode:
            chmod.append(f)
    keep = {f.path for f in new.files}
    return CommitPlan(tuple(write), tuple(chmod), tuple(sorted(p for p in before if p not in keep)))


def held_chunks(old: Manifest | None, present: Mapping[str, int]) -> dict[str, tuple[str, int]]:
    """hash -> (path, offset) of the chunks the workspace already has on disk (files whose size
    still matches their manifest entry), from which a commit copies instead of refetching."""
    out: dict[str, tuple[str, int]] = {}
    if old is None:
        return out
    for f in old.files:
        if present.get(f.path) == f.size:
            for i, h in enumerate(f.chunks):
                out.setdefault(h, (f.path, i * old.chunk_bytes))
    return out


# ---------------------------------------------------------------------------- storage rules

def over_limit(usage: Mapping[str, int], limit: int) -> dict[str, str]:
    """user -> reason, for every user whose workspaces hold more than ``limit`` bytes."""
    return {u: f"{STORAGE_REASON} workspaces hold {human(b)}, over the limit of {human(limit)}; "
               "clean up, then `hfai workspace restore-request`"
            for u, b in sorted(usage.items()) if b > limit}


def restrict(current: RestrictedUsers, over: Mapping[str, str]) -> RestrictedUsers | None:
    """The restricted users after a scan found ``over`` (None: no change). A scan only adds: the
    restriction is lifted when its user asks (:func:`lift`), after cleaning up."""
    new = {**current.users, **{u: r for u, r in over.items() if u not in current.users}}
    return None if new == current.users else RestrictedUsers(users=new)


def lift(current: RestrictedUsers, user: str, used: int, limit: int) -> RestrictedUsers | None:
    """Lift ``user``'s storage restriction if their usage is back within the limit (None: no
    change). A restriction some other rule set is not ours to lift."""
    reason = current.users.get(user)
    if reason is None or not reason.startswith(STORAGE_REASON) or used > limit:
        return None
    return RestrictedUsers(users={u: r for u, r in current.users.items() if u != user})


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} TB"


# ------------------------------------------------------------------------------------- GC

#: Levels walked inside a workspace; entries at the last level move as a whole.
GC_DEPTH = 3


@dataclass(frozen=True)
class Entry:
    """A path relative to a workspace, as GC sees it: ``newest`` is the latest mtime in it
    (of the file itself; for a directory at the last level, of everything below it)."""

    rel: str
    is_dir: bool
    depth: int
    newest: float


def gc_moves(entries: Iterable[Entry], now: float, age_s: float, depth: int = GC_DEPTH) -> list[str]:
    """What GC moves out of a workspace: files at levels 1..depth untouched for ``age_s``, and
    directories at level ``depth`` whose whole content is that old (they move whole)."""
    out = []
    for e in entries:
        if now - e.newest <= age_s:
            continue
        if (not e.is_dir and e.depth <= depth) or (e.is_dir and e.depth == depth):
            out.append(e.rel)
    return sorted(out)


def gc_expired(stamps: Iterable[str], now: float, keep_s: float) -> list[str]:
    """The gc entries (directories named by the epoch second they were moved at) to delete."""
    return sorted(s for s in stamps if s.isdigit() and now - int(s) > keep_s)
