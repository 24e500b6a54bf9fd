"""Free loopback ports for servers the simulators and tests start."""

from __future__ import annotations

import random
import socket
from typing import Final

__all__ = ["bound_socket", "free_port"]

_RANGE: Final = (20_000, 32_000)
"""Below Linux's ephemeral range (32768–60999): a port found free here is not taken by an outgoing connection
before the server binds it, as one handed out by ``bind(0)`` can be when many tests run side by side."""


def bound_socket() -> socket.socket:
    """A TCP socket bound to a free loopback port, for a server started in this process to listen on: held from
    the moment it is found, so no other test can take the port before the server binds it (``free_port``'s gap)."""
    for _ in range(200):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", random.randrange(*_RANGE)))
        except OSError:
            sock.close()
            continue
        return sock
    raise RuntimeError(f"no free loopback port in {_RANGE}")


def free_port() -> int:
    """A loopback TCP port nothing listens on now (checked by binding it), for a server in another process; one in
    this process takes ``bound_socket`` instead."""
    with bound_socket() as sock:
        port: int = sock.getsockname()[1]
        return port
