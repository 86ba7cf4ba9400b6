"""The ``hfai`` command run inside the test's process: click's CliRunner around the real entry
point, answering as ``subprocess.run`` does (returncode, stdout, stderr), so a check reads the
same either way. It spares the interpreter start and imports of a process per call (~0.5 s of
CPU each). Tests about the process itself (the console script's exit status, signals, what an
import pulls in, a command that replaces the process) start a real one instead.

One call leaves nothing behind that the next one could see: the environment and the working
directory, the root logger's handlers and level, and the signal handlers are as they were.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

#: Signals whose handlers a command (asyncio.run, a follow loop) may replace.
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE, signal.SIGHUP)


@contextlib.contextmanager
def isolated(cwd: str | Path | None = None) -> Iterator[None]:
    """Run a command in ``cwd`` and undo what it may change in the process afterwards."""
    old_cwd, old_environ = os.getcwd(), dict(os.environ)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    handlers_of = {sig: signal.getsignal(sig) for sig in _SIGNALS}
    execv = os.execv

    def no_exec(*args: object) -> None:
        # `hfai python FILE` without `--` replaces the process with python: here that would be
        # pytest's. Such a test must start a real `hfai`.
        raise AssertionError(f"the in-process hfai tried to exec {args!r}: run it as a subprocess")

    os.execv = no_exec  # type: ignore[assignment]
    try:
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.execv = execv
        os.chdir(old_cwd)
        if os.environ != old_environ:  # CliRunner puts back only the variables it was given
            os.environ.clear()
            os.environ.update(old_environ)
        for h in root.handlers[:]:
            if h not in handlers:
                root.removeHandler(h)
        root.setLevel(level)
        # Only the main thread may set handlers (and only there does asyncio.run install any).
        if threading.current_thread() is threading.main_thread():
            for sig, handler in handlers_of.items():
                if handler is not None and signal.getsignal(sig) is not handler:
                    signal.signal(sig, handler)


def run(args: Sequence[str], env: Mapping[str, str | None] | None = None,
        cwd: str | Path | None = None) -> subprocess.CompletedProcess[str]:
    """``hfai ARGS`` in this process. ``env`` changes the environment for the call only (a None
    value unsets a variable). An exception that escapes the command is written to stderr as the
    interpreter would write it, so a test that a mistake gives no traceback can still fail."""
    from click.testing import CliRunner

    # Looked up on each call: the command's module may move without breaking collection.
    from hfai.cli.main import main

    with isolated(cwd):
        r = CliRunner().invoke(main, list(args), env=dict(env or {}), prog_name="hfai")
    stderr = r.stderr
    if r.exc_info is not None and not isinstance(r.exc_info[1], SystemExit):
        stderr += "".join(traceback.format_exception(*r.exc_info))
    return subprocess.CompletedProcess(["hfai", *args], r.exit_code, r.stdout, stderr)
