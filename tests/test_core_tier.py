"""The core tier's guard (``tests/conftest.py``): a test marked ``core`` cannot reach the network or start a
process, so ``pytest -m core`` stays pure and fast; an unmarked test can."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys

import pytest


@pytest.mark.core
def test_a_core_test_cannot_bind_connect_or_spawn() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        with pytest.raises(AssertionError, match="core test may not bind"):
            udp.bind(("127.0.0.1", 0))
        with pytest.raises(AssertionError, match="core test may not sendto"):
            udp.sendto(b"x", ("127.0.0.1", 9))
    with socket.socket() as tcp, pytest.raises(AssertionError, match="core test may not connect"):
        tcp.connect(("127.0.0.1", 9))
    with pytest.raises(AssertionError, match="core test may not start a process"):
        subprocess.run([sys.executable, "-c", "pass"], check=False)


@pytest.mark.core
async def test_a_core_test_keeps_its_event_loop() -> None:
    """The loop's own wake-up socket pair is not the network: asyncio works in the core tier."""
    assert await asyncio.wait_for(asyncio.sleep(0, result=7), 1) == 7


def test_an_end_to_end_test_may_bind() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.bind(("127.0.0.1", 0))
        assert udp.getsockname()[1] > 0
