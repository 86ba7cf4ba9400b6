"""``hfai.client.bind_hf_except_hook(Process)``: one process's uncaught exception fails the job.

Without it, a worker started with ``multiprocessing.Process`` that dies of an exception leaves the
other workers waiting in their next collective and the parent in ``join()``, and the job hangs
until someone notices. The hook wraps ``Process.run``: an exception escaping it prints its
traceback, then stops the whole job — every other process under the job's root (the process that
bound the hook first, recorded in ``HFAI_EXCEPT_HOOK_ROOT`` so that workers it starts agree) is
killed, and the root gets SIGTERM, so the program exits non-zero within moments. On the platform
that is a failed run, as in the original (which asked its server to fail the job).

``torch.multiprocessing.spawn`` (and :func:`hfai.multiprocessing.spawn`) need no hook: their
parent already stops the other workers and raises when one fails.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import traceback
from typing import Any

ROOT_ENV = "HFAI_EXCEPT_HOOK_ROOT"
#: How long the failing process waits for the root to go after SIGTERM before it sends SIGKILL.
GRACE_ENV, DEFAULT_GRACE_S = "HFAI_EXCEPT_HOOK_GRACE_S", 5.0
_MARK = "_hfai_except_hook"


def bind_hf_except_hook(process_class: type) -> None:
    """Make an uncaught exception in ``process_class.run`` (``multiprocessing.Process``, which
    ``torch.multiprocessing.Process`` is) end the whole job. Safe to call more than once."""
    run = getattr(process_class, "run", None)
    if not isinstance(process_class, type) or not callable(run):
        raise TypeError(f"bind_hf_except_hook takes a Process class (multiprocessing.Process), got {process_class!r}")
    os.environ.setdefault(ROOT_ENV, str(os.getpid()))
    if getattr(run, _MARK, False):
        return

    @functools.wraps(run)
    def hooked_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return run(self, *args, **kwargs)
        except Exception:
            sys.stderr.write(f"hfai: process {os.getpid()} ({getattr(self, 'name', '?')}) failed; stopping the job\n")
            traceback.print_exc()
            sys.stderr.flush()
            fail_job()
            # Printed above already: exit 1 without multiprocessing printing the traceback again.
            sys.exit(1)

    setattr(hooked_run, _MARK, True)
    process_class.run = hooked_run  # type: ignore[attr-defined]


def job_root() -> int:
    """The job's root process: the recorded one if it is this process's ancestor, else the parent."""
    import psutil

    me = psutil.Process()
    ancestors = {p.pid for p in me.parents()}
    try:
        recorded = int(os.environ.get(ROOT_ENV, ""))
    except ValueError:
        recorded = -1
    return recorded if recorded in ancestors else os.getppid()


def fail_job(grace_s: float | None = None) -> None:
    """Kill every other process of the job, SIGTERM its root, SIGKILL it if it is still there
    after ``grace_s`` (default ``$HFAI_EXCEPT_HOOK_GRACE_S``, 5 s)."""
    import psutil

    if grace_s is None:
        try:
            grace_s = float(os.environ.get(GRACE_ENV, DEFAULT_GRACE_S))
        except ValueError:
            grace_s = DEFAULT_GRACE_S
    root_pid = job_root()
    try:
        root = psutil.Process(root_pid)
        others = [p for p in root.children(recursive=True) if p.pid != os.getpid()]
    except psutil.Error:
        return
    for p in others:
        _signal(p, signal.SIGKILL)
    _signal(root, signal.SIGTERM)
    if not _gone(root, grace_s):
        _signal(root, signal.SIGKILL)


def _gone(p: Any, timeout_s: float) -> bool:
    """Whether ``p`` ended within ``timeout_s``; a zombie counts (the root is not our child, so
    its own parent reaps it)."""
    import time

    import psutil

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _signal(p: Any, sig: int) -> None:
    import psutil

    try:
        p.send_signal(sig)
    except psutil.Error:
        pass  # the process is gone already: nothing left to signal
