"""Launchers forked from one pre-imported process: ``python -m hfai.agent.zygote``.

Exec'ing a fresh interpreter for every run's launcher (interpreter start and imports) would cap a
node at a few runs per second. The agent instead starts this *zygote*
once: it imports the launcher and waits on its stdin for run directories, one per line. For each
it hands the directory to a child forked ahead (see :func:`serve`) that becomes a launcher exactly
as ``python -m hfai.agent.launcher RUN_DIR`` would be — a session of its own, stdin/stdout/stderr
on /dev/null, :func:`hfai.agent.launcher.main` — and answers the child's pid on stdout. A fork of
this small process costs about a millisecond.

What the launcher guarantees is unchanged, as the same code runs: the job in its own process
group, the uid switch in the job only, the exit status in the run directory, self-fencing. The
forked launchers do not depend on the zygote: it reaps nothing they need (children are reaped by
the kernel: SIGCHLD is ignored here, reset in every child), and it exits when the agent closes its
stdin or dies, leaving its launchers running for the next agent to adopt.

The agent's side is :class:`Zygote`: a blocking request with a bounded wait (the agent starts runs
synchronously, so a snapshot never sees a run directory without its launcher's pid). Any fault of
the zygote raises :class:`ZygoteError`; the caller then execs a fresh launcher instead.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading

from hfai.agent import launcher


class ZygoteError(RuntimeError):
    """The zygote did not start a launcher (dead, refused, or silent past its timeout)."""


class Zygote:
    """The agent's handle on its zygote process; started on first use, restarted after a fault."""

    def __init__(self, reply_timeout_s: float = 5.0):
        self.reply_timeout_s = reply_timeout_s
        self._proc: subprocess.Popen | None = None

    def spawn(self, run_dir: str) -> int:
        """Fork a launcher for ``run_dir``; returns its pid. Raises ZygoteError (and drops the
        zygote, so the next call starts a fresh one)."""
        if "\n" in run_dir:
            raise ZygoteError(f"run directory {run_dir!r} cannot be sent on one line")
        try:
            proc = self._proc or self._start()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"{run_dir}\n".encode())
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], self.reply_timeout_s)
            line = proc.stdout.readline() if ready else b""
            pid = int(line)
        except (OSError, ValueError) as e:
            self.close()
            raise ZygoteError(f"the launcher zygote did not answer: {e or type(e).__name__}") from None
        if pid <= 0:
            self.close()
            raise ZygoteError("the launcher zygote could not fork")
        return pid

    def warm(self) -> None:
        """Start the zygote now, if it is not running, rather than on the first run: its start (an
        interpreter and the launcher's imports, ~0.1 s of CPU) then neither delays a node's first
        run nor competes with the runs for the CPU. A failure is left to the first spawn, which
        starts one again (or falls back to an exec'd launcher)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        try:
            self._start()
        except OSError:
            self._proc = None

    def _start(self) -> subprocess.Popen:
        # The agent's own environment, like an exec'd launcher; a session of its own, so that a
        # signal to the agent's terminal or group does not reach it (or, through it, nothing).
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "hfai.agent.zygote"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, start_new_session=True, bufsize=0,
        )
        return self._proc

    def close(self, timeout_s: float = 5.0) -> None:
        """End the zygote (its launchers keep running). Safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


_shared: dict[float, Zygote] = {}


def shared(reply_timeout_s: float = 5.0) -> Zygote:
    """This process's zygote: agents hosted together (agent/fleet.py) fork from one. It ends when
    this process does (its stdin closes); the runs it forked go on."""
    z = _shared.get(reply_timeout_s)
    if z is None:
        z = _shared[reply_timeout_s] = Zygote(reply_timeout_s)
    return z


def serve(requests, replies) -> int:
    """The zygote's loop: a run directory per line of ``requests`` (binary), a pid (or 0 if the
    fork failed) per line of ``replies``; returns at end of input.

    A *spare* launcher is forked ahead of each request and has settled (it leads a session of its
    own, its stdio on /dev/null) before it is handed out: a request only passes the run directory
    to it and answers its pid. Forking on request and waiting for the child to settle would put two
    more process switches (a fork, the child's setsid) on every run's path; the next spare is
    forked after the answer, while the run goes on.

    The launchers hand the files to fsync as their run ends (launcher._persist_after_exit) to a
    thread of this process, through a pipe each inherits the write end of; once the input ends,
    what they handed over is synced before this returns. A launcher that outlives this process
    gets EPIPE and syncs its files itself."""
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the launchers: no zombies
    sync_r, sync_w = os.pipe2(os.O_CLOEXEC)  # no job inherits either end
    os.set_blocking(sync_w, False)
    threading.Thread(target=_sync_loop, args=(sync_r, bytearray()), name="fsync", daemon=True).start()
    try:
        _serve(requests, replies, sync_r, sync_w)
    finally:
        os.close(sync_w)
        os.set_blocking(sync_r, False)
        _sync_handed(sync_r, bytearray())  # what is in the pipe now (the thread may sync some of it too)
    return 0


def _serve(requests, replies, sync_r: int, sync_w: int) -> None:
    spare = _fork_spare(sync_r, sync_w)
    for line in requests:
        run_dir = line.rstrip(b"\n")
        pid = 0
        if spare is not None and run_dir:
            pid, to_spare = spare
            try:
                os.write(to_spare, run_dir + b"\n")  # a path is far below the pipe's atomic size
            except OSError:
                pid = 0  # the spare is gone (killed): the agent falls back to an exec'd launcher
            os.close(to_spare)
        replies.write(f"{pid}\n".encode())
        replies.flush()
        spare = _fork_spare(sync_r, sync_w)
    if spare is not None:
        os.close(spare[1])  # the spare reads end of input and leaves


def _sync_loop(sync_r: int, rest: bytearray) -> None:
    """The fsync thread: the files the launchers hand over, a line each (NUL-separated paths)."""
    while _sync_handed(sync_r, rest):
        pass


def _sync_handed(sync_r: int, rest: bytearray) -> bool:
    """fsync the files of the whole lines read from ``sync_r`` at once (``rest``: a line's start
    that the last read ended in, kept for the next); False at its end (or, not blocking, once
    empty)."""
    try:
        data = os.read(sync_r, 1 << 16)
    except OSError:  # BlockingIOError: nothing more now
        return False
    rest += data
    *lines, tail = bytes(rest).split(b"\n")
    rest[:] = tail
    for line in lines:
        launcher._fsync_all([os.fsdecode(p) for p in line.split(b"\0") if p])
    return bool(data)


def _fork_spare(sync_r: int, sync_w: int) -> tuple[int, int] | None:
    """Fork a launcher-to-be and wait until it settled; returns its pid and the pipe on which it
    waits for its run directory, or None if the fork failed."""
    settled, settled_w = os.pipe()
    work, work_w = os.pipe()
    try:
        pid = os.fork()
    except OSError:
        for fd in (settled, settled_w, work, work_w):
            os.close(fd)
        return None
    if pid == 0:
        os.close(settled)
        os.close(work_w)
        os.close(sync_r)  # only the zygote reads it: once it is gone, a write meets EPIPE
        _become_launcher(work, settled_w, sync_w)  # never returns
    os.close(settled_w)
    os.close(work)
    os.read(settled, 1)  # EOF once the child is settled (or gone)
    os.close(settled)
    return pid, work_w


def _become_launcher(work: int, settled: int, syncer: int) -> None:
    """In the forked child: what ``python -m hfai.agent.launcher RUN_DIR`` started in a new
    session with /dev/null for stdio would be, once ``work`` gives it a run directory (at end of
    input it leaves: the zygote ended). Never returns into the zygote's loop."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the launcher waits for its job
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)  # also lets go of the zygote's pipes
        if null > 2:
            os.close(null)
        os.close(settled)
        with os.fdopen(work, "rb") as f:
            run_dir = f.readline().rstrip(b"\n").decode()
        if not run_dir:
            code = 0
            return
        os.chdir(run_dir)
        code = launcher.main([run_dir], syncer)
    except BaseException:
        code = 1  # no stderr to tell: the agent sees a launcher gone without an exit status
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(serve(sys.stdin.buffer, sys.stdout.buffer))
