"""Swapping two directory entries in one step: Linux ``renameat2(..., RENAME_EXCHANGE)``.

A commit swaps the workspace's directory with the tree assembled for it, so a reader resolving the
workspace's path finds one whole tree or the other, never a mix. Python has no binding for
``renameat2``; it is called through libc (glibc 2.28+, Linux 3.15+). Filesystems without the
operation (NFS, some FUSE ones) answer EINVAL: :func:`exchange` then says False and the caller
falls back to replacing files in place (see docs/storage.md).
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}



def _load() -> Callable[..., int] | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not Linux, or a libc without it
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_renameat2 = _load()


def exchange(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Atomically swap the entries ``a`` and ``b`` (both must exist, on one filesystem).
    Returns False, changing nothing, where the kernel or filesystem cannot."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), os.fspath(a), None, os.fspath(b))
