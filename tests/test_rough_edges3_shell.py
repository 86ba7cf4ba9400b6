"""`hfai shell JOB -- CMD` printed ``^@`` before the command's output (issue 39 item 11).

The NUL was the client's: script(1), and anything else that types Ctrl-D on the terminal before
the session put it in raw mode, leaves an end-of-file pending in the terminal's line buffer, and
Linux hands a reader that switched to raw mode each pending end-of-file as a NUL byte. The remote
terminal echoed it as ``^@``. These run the client's terminal handling on a real pseudo-terminal."""

from __future__ import annotations

import os
import pty
import termios

import pytest

from hfai.cli.exec import _raw


@pytest.fixture
def terminal():
    master, slave = pty.openpty()
    yield master, slave
    os.close(master)
    os.close(slave)


def _pending(fd: int) -> bytes:
    os.set_blocking(fd, False)
    try:
        return os.read(fd, 1024)
    except BlockingIOError:
        return b""
    finally:
        os.set_blocking(fd, True)


def test_an_end_of_file_typed_ahead_reaches_the_shell_as_ctrl_d_not_a_nul(terminal):
    master, slave = terminal
    os.write(master, b"\x04")  # what script(1) types when its own input ends
    with _raw(slave) as ahead:
        assert ahead == b"\x04"
        assert _pending(slave) == b""  # no NUL left for the relay to send
    assert termios.tcgetattr(slave)[3] & termios.ICANON  # put back


def test_lines_typed_ahead_are_kept_in_order_and_the_rest_stays_for_the_relay(terminal):
    master, slave = terminal
    os.write(master, b"ls\n\x04cd /tm")  # two whole lines (the second ended by Ctrl-D), a partial one
    with _raw(slave) as ahead:
        assert ahead == b"ls\n\x04"
        assert _pending(slave) == b"cd /tm"


def test_nothing_typed_ahead_is_nothing(terminal):
    _, slave = terminal
    with _raw(slave) as ahead:
        assert ahead == b""
