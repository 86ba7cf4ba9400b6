"""Fault points: a named line where the fault-injection suite can freeze a controller on purpose.

A pause "at the worst moment" (a leader stopped between deciding and writing) is a race that a
signal sent from outside hits only by luck. At a fault point the replica stops itself (SIGSTOP)
when the file named by the environment variable ``HFAI_FAULT_FREEZE_FILE`` holds that point's
name and subject (``assignment-put node-1``); the file is removed first, so exactly one replica
freezes there, once, and the test thaws it with SIGCONT when it wants the late write to happen.
Without the variable (production) a fault point is one dictionary look-up.
"""

from __future__ import annotations

import os
import signal

FREEZE_ENV = "HFAI_FAULT_FREEZE_FILE"

#: Right before a leader sends an assignment write for a node (subject: the node).
ASSIGNMENT_PUT = "assignment-put"


def arm(path: str | os.PathLike, point: str, subject: str) -> None:
    """Ask the next replica that reaches ``point`` for ``subject`` to freeze (tests)."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        f.write(f"{point} {subject}\n")
    os.replace(tmp, path)  # a replica reads the whole request or none


def freeze_point(point: str, subject: str) -> None:
    """Stop this process here if the fault file asks for ``point`` and ``subject``."""
    path = os.environ.get(FREEZE_ENV)
    if not path:
        return
    try:
        with open(path) as f:
            wanted = f.read().split()
    except FileNotFoundError:
        return
    if wanted != [point, subject]:
        return
    try:
        os.unlink(path)
    except FileNotFoundError:
        return  # another replica took it first
    os.kill(os.getpid(), signal.SIGSTOP)
