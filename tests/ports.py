"""A free TCP port on loopback, for the tests that start servers of their own."""

import socket


def free_port() -> int:
    """A port nothing listens on now (the OS's pick; a race with another process is possible but
    harmless for these tests, which fail loudly on a bind error)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
