"""A real ``redis-server`` (Debian's package) on a loopback port, for what needs a shared call registry here: the
tests of it, and load runs of ``serve --workers N``. No persistence: each server starts empty and is gone when it
stops."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager

from callbridge.sim.ports import free_port

__all__ = ["registry_env", "running_redis", "start_redis"]


def start_redis(port: int, timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """An empty ``redis-server`` on 127.0.0.1:``port``, listening (again, after one there was stopped);
    ``AssertionError`` if it is not installed, exits, or does not listen within ``timeout_s``."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed (apt-get install redis-server)"
    process = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"redis-server exited with {process.returncode}")
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.02)
    process.kill()
    raise AssertionError(f"redis-server not listening on {port} within {timeout_s} s")


@contextmanager
def running_redis() -> Iterator[str]:
    """An empty ``redis-server`` on a free loopback port while the block runs: its URL (a benchmark's own)."""
    port = free_port()
    process = start_redis(port)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def registry_env(redis_url: str) -> dict[str, str]:
    """The environment that puts a bridge's call registry on ``redis_url`` (what ``serve --workers N`` needs)."""
    return {"CALLBRIDGE_REGISTRY__BACKEND": "redis", "CALLBRIDGE_REGISTRY__REDIS_URL": redis_url}
