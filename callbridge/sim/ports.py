"""Free loopback ports for servers the simulators and tests start."""

from __future__ import annotations

import random
import socket
from typing import Final

__all__ = ["free_port"]

_RANGE: Final = (20_000, 32_000)
"""Below Linux's ephemeral range (32768–60999): a port found free here is not taken by an outgoing connection
before the server binds it, as one handed out by ``bind(0)`` can be when many tests run side by side."""


def free_port() -> int:
    """A loopback TCP port nothing listens on now (checked by binding it)."""
    for _ in range(200):
        port = random.randrange(*_RANGE)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {_RANGE}")
