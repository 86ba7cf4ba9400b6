"""Where a job's stdout and stderr go, as the launcher sets it up (launcher.py).

The job writes to a pipe; the launcher reads it and appends to the run's log through a
:class:`~hfai.agent.logcap.CappedLog`, which bounds the run's part of the log and absorbs a full
disk, and notes when each line came (logtimes.py) and when the job last wrote (the watchdog's).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import stat
import time
from collections.abc import Callable, Iterator

from hfai.agent.logcap import CappedLog
from hfai.agent.logtimes import TimesWriter, times_path

_READ_BYTES = 1 << 20
_PIPE_BYTES = 1 << 20  # asked of the kernel (F_SETPIPE_SZ): fewer wake-ups for a chatty job
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# After the job and what it left are gone, output still in the pipe is read for this long at
# most: a process out of the launcher's reach (see launcher.py) may hold the pipe open forever.
DRAIN_S = 2.0


class Output:
    """The job's output channel: ``job_fd`` is what the job gets as stdout and stderr;
    ``pipe_fd`` is what the launcher waits on and :meth:`pump` reads (None once closed)."""

    def __init__(self, log_fd: int, cap: int, times_fd: int | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._log_fd = log_fd
        self.clock = clock  # the silence's clock, which the watchdog reads too
        self._times_fd = times_fd
        self._sink = CappedLog(log_fd, cap, TimesWriter(times_fd) if times_fd is not None else None)
        # When the job last wrote anything (on ``clock``; its start until then): the watchdog's
        # silence is measured from it (agent/watchdog.py).
        self.last_output = clock()
        pipe_fd, write_end = os.pipe2(os.O_CLOEXEC)
        self.pipe_fd: int | None = pipe_fd
        # Every writer closed the pipe (read its end): it stays readable, so whoever waits for the
        # job's exit must no longer wait on it (the launcher would spin until the exit).
        self.ended = False
        self._write_end: int | None = write_end
        try:
            fcntl.fcntl(write_end, _F_SETPIPE_SZ, _PIPE_BYTES)
        except OSError:
            pass  # above /proc/sys/fs/pipe-max-size: the default size works too
        os.set_blocking(pipe_fd, False)

    @property
    def job_fd(self) -> int:
        assert self._write_end is not None, "the job was started already"
        return self._write_end

    def job_started(self) -> None:
        """The job holds its end now: the launcher's copy goes, so the pipe ends with the job's."""
        self.last_output = self.clock()
        if self._write_end is not None:
            os.close(self._write_end)
            self._write_end = None

    def write(self, data: bytes) -> None:
        """A line of the launcher's own (never raises for a full disk: the line is dropped)."""
        self._sink.write(data)

    def pump(self) -> bool:
        """Relay what the pipe holds now; False once every writer has closed it."""
        if self.pipe_fd is None:
            return False
        while True:
            try:
                data = os.read(self.pipe_fd, _READ_BYTES)
            except BlockingIOError:
                return True
            if not data:
                self.ended = True
                return False
            self.last_output = self.clock()
            self._sink.write(data)

    def drain(self, limit_s: float = DRAIN_S) -> None:
        """Relay the rest of the output once the job is over (until the pipe ends, or ``limit_s``)."""
        if self.pipe_fd is None:
            return
        deadline = time.monotonic() + limit_s
        while (left := deadline - time.monotonic()) > 0:
            select.select([self.pipe_fd], [], [], left)
            if not self.pump():
                return

    def close(self) -> None:
        for fd in (self.pipe_fd, self._write_end):
            if fd is not None:
                os.close(fd)
        self.pipe_fd = self._write_end = None
        if self._times_fd is not None:
            os.close(self._times_fd)
            self._times_fd = None
        os.close(self._log_fd)


@contextlib.contextmanager
def open_output(log: str, cap: int) -> Iterator[Output]:
    """The output channel of a run whose log is ``log``, ``cap`` bytes at most (logcap.py);
    closed after."""
    fd = os.open(log, os.O_NOFOLLOW | os.O_CLOEXEC | os.O_RDWR)
    times_fd = _open_times(log)
    try:
        out = Output(fd, cap, times_fd)
    except BaseException:
        os.close(fd)
        if times_fd is not None:
            os.close(times_fd)
        raise
    try:
        yield out
    finally:
        out.close()


def _open_times(log_path: str) -> int | None:
    """The log's times file (hfai.agent.logtimes), made if missing; None if it cannot be had (the
    run goes on: its lines are then stamped when read)."""
    try:
        fd = os.open(times_path(log_path), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd
