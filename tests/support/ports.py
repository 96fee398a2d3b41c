"""Ports for the servers the tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (the kernel's pick; another process
    could take it before the test binds it, which the loopback of a test machine makes rare)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
