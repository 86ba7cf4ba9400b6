"""Write a small file atomically: temp file in the same directory, fsync, rename.

Readers (the agent polling a control file, a resumed job reading its state) then see either the
old content or the new, never a torn write.
"""

from __future__ import annotations

import os


def write_atomic(path: str | os.PathLike, data: bytes | str, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data``; a new file gets ``mode`` (less the umask) from its creation
    on, so a secret (0o600) is never readable by others, even briefly."""
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        with open(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:  # leave no temp file behind (a full disk, ``path`` a directory, ...)
            os.unlink(tmp)
        except OSError:
            pass  # never made, or not removable: the error raised next is the one that matters
        raise
