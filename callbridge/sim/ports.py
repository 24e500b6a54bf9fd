"""Free loopback ports for servers the simulators and tests start."""

from __future__ import annotations

import itertools
import math
import os
import random
import socket
from typing import Final

__all__ = ["RTP_PORTS", "bound_socket", "free_port"]

_RANGE: Final = (20_000, 32_000)
"""Below Linux's ephemeral range (32768–60999): a port found free here is not taken by an outgoing connection
before the server binds it, as one handed out by ``bind(0)`` can be when many tests run side by side."""


RTP_PORTS: Final = {"rtp_port_min": 12_000, "rtp_port_max": 19_999}
"""The RTP range of a bridge the simulators and tests run SIP calls on: apart from ``_RANGE``, where a peer's
media ports are picked. SIPp plays a pcap from a raw socket and never binds the port its SDP names, so a bridge
whose range held that port could bind it for another call and get the first call's RTP (a CI failure:
180 packets from an unexpected source)."""


def _ports() -> range:
    """This process's share of ``_RANGE``: under pytest-xdist each worker has its own slice, so a port one worker
    found free for a server process that is still starting (seconds, for ``free_port``) is never picked by
    another worker meanwhile (it was, picked at random from the whole range: EADDRINUSE a run in ten)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    index = int(worker[2:]) % workers if worker.startswith("gw") and worker[2:].isdigit() else 0
    size = (_RANGE[1] - _RANGE[0]) // workers
    return range(_RANGE[0] + index * size, _RANGE[0] + (index + 1) * size)


def _stride(size: int) -> int:
    """A step through the slice that visits every port before any again and never hands out two neighbours in a
    row (a peer may bind port + 1 as well: baresip listens for SIP over TLS there)."""
    stride = 7
    while math.gcd(stride, size) != 1:
        stride += 2
    return stride


_PORTS: Final = _ports()
_STRIDE: Final = _stride(len(_PORTS))
_NEXT: Final = itertools.count(random.randrange(len(_PORTS)))
"""Ports are handed out in turn through the slice (from a random start, so processes sharing it start apart): one
is picked again only after all the others."""


def bound_socket() -> socket.socket:
    """A TCP socket bound to a free loopback port, for a server started in this process to listen on: held from
    the moment it is found, so no other test can take the port before the server binds it (``free_port``'s gap)."""
    for _ in range(200):
        sock = socket.socket()
        try:
            sock.bind(("127.0.0.1", _PORTS[next(_NEXT) * _STRIDE % len(_PORTS)]))
        except OSError:
            sock.close()
            continue
        return sock
    raise RuntimeError(f"no free loopback port in {_PORTS}")


def free_port() -> int:
    """A loopback TCP port nothing listens on now (checked by binding it), for a server in another process; one in
    this process takes ``bound_socket`` instead."""
    with bound_socket() as sock:
        port: int = sock.getsockname()[1]
        return port
