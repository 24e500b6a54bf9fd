"""A real ``redis-server`` (Debian's package; ``.ci/run`` installs it) on a free loopback port, for the tests
of the shared call registry. No persistence: each test session gets an empty server, gone when it stops."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from callbridge.sim.redis_server import start_redis
from callbridge.sim.runner import free_port

__all__ = ["redis_server", "redis_url", "start_redis", "stop_process"]


@contextmanager
def redis_server() -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A ``redis-server`` of its own: (its URL, the process, for a test that stops it early); skips the test
    where the binary is absent."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; CI installs it)")
    port = free_port()
    process = start_redis(port)
    try:
        yield f"redis://127.0.0.1:{port}/0", process
    finally:
        stop_process(process, timeout_s=10)


def stop_process(process: subprocess.Popen[bytes], *, timeout_s: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited within ``timeout_s``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    """``redis://127.0.0.1:<port>/0`` of a ``redis-server`` this fixture started (and stops)."""
    with redis_server() as (url, _):
        yield url
