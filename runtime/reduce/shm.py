"""POSIX shared-memory segments: create, attach, unlink, and never leak one.

The lifetime rule that keeps ``/dev/shm`` clean even after ``kill -9``: a segment's *name* only
exists between its creation and the moment every local rank has mapped it. The creator then
unlinks the name; the memory lives on while any process maps it and the kernel frees it when the
last one exits, however it exits. Names still pending at interpreter exit are unlinked by an
``atexit`` hook, and :func:`remove_stale_segments` removes names whose creator process is gone
(a crash inside the short setup window).

Linux only in practice (``/dev/shm``); the segment API itself is POSIX.
"""

from __future__ import annotations

import atexit
import importlib
import logging
import mmap
import os
import re
import secrets
import threading
from typing import Protocol, cast

logger = logging.getLogger(__name__)

PREFIX = "hfai-reduce"
SHM_DIR = "/dev/shm"
_NAME_RE = re.compile(rf"^{re.escape(PREFIX)}-(\d+)-[0-9a-f]+$")



class _PosixShmem(Protocol):
    """The two functions used from ``_posixshmem`` (typeshed has no stub for it)."""

    def shm_open(self, path: str, flags: int, mode: int = 0o777) -> int: ...

    def shm_unlink(self, path: str) -> None: ...


# CPython's own shm_open/shm_unlink binding, as used by multiprocessing.shared_memory.
_posixshmem = cast(_PosixShmem, importlib.import_module("_posixshmem"))

_pending_lock = threading.Lock()
_pending_unlink: set[str] = set()
_atexit_registered = False


def new_name() -> str:
    """A fresh segment name that records the creating pid (for stale-segment cleanup)."""
    return f"{PREFIX}-{os.getpid()}-{secrets.token_hex(8)}"


class Segment:
    """One mapped shared-memory segment. Use :meth:`create` or :meth:`attach`.

    ``buffer`` is the writable mapping. Views into it (numpy arrays, torch tensors) keep the
    mapping alive on their own, so :meth:`close` only drops this object's reference.
    """

    def __init__(self, name: str, buffer: mmap.mmap, created: bool) -> None:
        self.name = name
        self.buffer: mmap.mmap | None = buffer
        self.created = created
        self.size = len(buffer)

    @classmethod
    def create(cls, size: int, name: str | None = None) -> Segment:
        """Create and map a new zero-filled segment of ``size`` bytes (exclusive: fails if the
        name exists). Its name is unlinked at exit unless :meth:`unlink` runs first."""
        if size <= 0:
            raise ValueError(f"segment size must be positive, got {size}")
        name = name or new_name()
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        _remember(name)
        try:
            os.ftruncate(fd, size)
            buf = _map(fd, size)
        except BaseException:
            unlink_name(name)
            raise
        finally:
            os.close(fd)
        return cls(name, buf, created=True)

    @classmethod
    def attach(cls, name: str) -> Segment:
        """Map an existing segment by name (raises ``FileNotFoundError`` if it is gone)."""
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, 0o600)
        try:
            size = os.fstat(fd).st_size
            buf = _map(fd, size)
        finally:
            os.close(fd)
        return cls(name, buf, created=False)

    def mapping(self) -> mmap.mmap:
        """The writable mapping; ``ValueError`` once :meth:`close` ran (as a closed mmap raises)."""
        if self.buffer is None:
            raise ValueError(f"shared-memory segment {self.name} is closed")
        return self.buffer

    def unlink(self) -> None:
        """Remove the name (idempotent; any rank may call it). The mapping stays valid."""
        unlink_name(self.name)

    def close(self) -> None:
        """Drop the mapping; it is unmapped once no view into it remains. Idempotent."""
        buf, self.buffer = self.buffer, None
        if buf is None:
            return
        try:
            buf.close()
        except BufferError:
            # Live numpy/torch views still export the buffer; they keep it mapped until freed.
            pass


def _map(fd: int, size: int) -> mmap.mmap:
    # MAP_POPULATE pre-faults the pages, so the first reduction does not pay a page fault per 4 KiB.
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    return mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)


def unlink_name(name: str) -> None:
    """Unlink a segment name; a name that is already gone is fine."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass  # unlinked already, by this rank or another
    with _pending_lock:
        _pending_unlink.discard(name)


def _remember(name: str) -> None:
    global _atexit_registered
    with _pending_lock:
        _pending_unlink.add(name)
        if not _atexit_registered:
            atexit.register(_unlink_pending)
            _atexit_registered = True


def _unlink_pending() -> None:
    with _pending_lock:
        names = list(_pending_unlink)
    for name in names:
        unlink_name(name)


def list_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Names of this package's segments that currently exist (i.e. whose setup is unfinished)."""
    try:
        entries = os.listdir(shm_dir)
    except FileNotFoundError:
        return []
    return sorted(e for e in entries if _NAME_RE.match(e))


def remove_stale_segments(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink segments whose creating process no longer exists; return their names.

    Only needed after a crash during group setup. Do not run it where several PID namespaces
    share one ``/dev/shm``: a live creator in another namespace would look dead from here.
    """
    removed = []
    for name in list_segments(shm_dir):
        match = _NAME_RE.match(name)
        if match and not pid_alive(int(match.group(1))):
            unlink_name(name)
            removed.append(name)
            logger.info("removed stale shared-memory segment %s", name)
    return removed


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` names a running (not zombie) process in this PID namespace."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        return _kill0(pid)
    # The state letter follows the parenthesised command name, which may itself contain ")".
    state = stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3]
    return state not in (b"Z", b"X")


def process_start_time(pid: int) -> int:
    """The kernel's start time of ``pid`` (clock ticks since boot), or 0 if unknown.

    Stored next to the pid so a recycled pid is not mistaken for the original process.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    fields = stat[stat.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else 0


def _kill0(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
