"""Write a small file atomically: temp file in the same directory, fsync, rename.

Readers (the agent polling a control file, a resumed job reading its state) then see either the
old content or the new, never a torn write.
"""

from __future__ import annotations

import os


def write_atomic(path: str | os.PathLike, data: bytes | str) -> None:
    path = os.fspath(path)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
