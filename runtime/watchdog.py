"""``hfai.set_watchdog_time(seconds)``: the original platform's log watchdog, enforced.

A job that writes no output (no line on any of its processes, on a node) for its watchdog time is
taken to have hung: the platform writes every process's Python stack into its log and ends it as
hung (it fails, or is requeued under ``hfai submit --restart-on-hang N``; docs/health.md). The
time is, in order: what the job last passed to :func:`set_watchdog_time`, its ``HF_WATCHDOG_TIME``
environment variable at submission (``hfai submit -e HF_WATCHDOG_TIME=...``), the cluster's
``[agent] watchdog_s`` (1,800 s unless an operator changed it). A development session has none.

The call reaches the run's launcher through the run's control directory (:data:`WATCHDOG_FILE`),
and takes effect within a second or so; it also sets ``HFAI_WATCHDOG_TIME`` for the worker
processes the job starts later. Off the platform it only checks its argument and sets that.

The stacks come from ``py-spy dump`` on the node; a process it cannot read gets
:data:`STACK_SIGNAL`, on which ``import hfai`` registered :mod:`faulthandler` in a job (see
:func:`register_stack_dump`), and writes its own stacks to its stderr, which is the log.
"""

from __future__ import annotations

import os
import signal
import sys

ENV = "HFAI_WATCHDOG_TIME"
#: The job's watchdog time as the original platform read it at the job's start.
START_ENV = "HF_WATCHDOG_TIME"
#: In the run's control directory: the seconds the job last set (read by its launcher).
WATCHDOG_FILE = "watchdog"
#: Asks a job's process to write its Python stacks to its stderr (faulthandler). Nothing else in
#: hfai uses it; a job that installs its own handler for it replaces this one.
STACK_SIGNAL = signal.SIGUSR2


def set_watchdog_time(seconds: int) -> None:
    """Take the job to have hung after ``seconds`` (an int > 0) without output, from now on."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise TypeError(f"set_watchdog_time takes an int number of seconds, got {seconds!r}")
    if seconds <= 0:
        raise ValueError(f"set_watchdog_time takes a number of seconds > 0, got {seconds}")
    os.environ[ENV] = str(seconds)
    control = os.environ.get("HFAI_CONTROL_DIR")
    if not control:
        return
    from hfai._atomic import write_atomic

    try:
        write_atomic(os.path.join(control, WATCHDOG_FILE), f"{seconds}\n")
    except OSError as e:
        # The training goes on under the watchdog time it had; the log says why.
        print(f"hfai: set_watchdog_time({seconds}) did not reach the platform ({e}); the job's watchdog time "
              "is unchanged", file=sys.stderr, flush=True)


def register_stack_dump() -> None:
    """Write this process's Python stacks (every thread) to its stderr on :data:`STACK_SIGNAL`,
    from C (faulthandler): it works while the interpreter is stuck in a call that holds the GIL."""
    import faulthandler

    try:
        faulthandler.register(STACK_SIGNAL, all_threads=True)
    except (ValueError, OSError, RuntimeError):
        pass  # no usable stderr: the launcher's py-spy is the only way then
