"""Shared fixtures: a free loopback port, and a real ``callbridge serve`` process."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass

import httpx
import pytest
import structlog
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from callbridge.codecs.opus import problem as opus_problem
from callbridge.compiled import compiled_modules
from callbridge.sim.runner import free_port
from tests.bytecode_cache import cache_bytecode
from tests.cpu_share import give_background_tests_time, rerun_real_time_tests, sharing_the_cpu

# The fuzzers (tests/fuzz/) run on a fixed budget: ``ci`` (the default) is derandomized, so every run draws the
# same examples; ``HYPOTHESIS_PROFILE=deep`` draws 25 times as many, at random, for a long local run (20,000 a
# carrier codec over its four tests).
_FUZZ_CHECKS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
hypothesis_settings.register_profile(
    "ci", max_examples=200, derandomize=True, database=None, deadline=None, suppress_health_check=_FUZZ_CHECKS
)
hypothesis_settings.register_profile("deep", max_examples=5_000, deadline=None, suppress_health_check=_FUZZ_CHECKS)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PATCHES_A_COMPILED_METHOD = pytest.mark.skipif(
    bool(compiled_modules()),
    reason="it patches a method the compiled call core or engine core calls itself, which then calls its own",
)
"""For the few tests that plant behaviour inside a core by patching its class: on the compiled build (CI's second
pass) the core's calls to its own methods do not go through the class attribute."""

PEERS = {
    "redis-server": "redis-server", "sipp": "sip-tester", "baresip": "baresip-core", "haproxy": "haproxy", "gcc": "gcc",
    "chromium": "chromium", "chromedriver": "chromium-driver",
}  # fmt: skip
"""Real peers some tests run (binary → Debian package; gcc: the Docker image's compiled build; Chromium: the browser
phone's page). Missing locally: those tests skip, saying why."""


NEEDS_LIBOPUS = pytest.mark.skipif(opus_problem() is not None, reason=f"Opus: {opus_problem()}")
"""For the tests that code Opus (``callbridge/codecs/opus.py`` loads Debian's ``libopus0``): CI requires it."""


def peer_binary(name: str) -> str | None:
    """Where a peer's binary is: on ``PATH``, or in the sbin directories Debian puts daemons in (HAProxy)."""
    return shutil.which(name) or shutil.which(name, path="/usr/local/sbin:/usr/sbin:/sbin")


def pytest_configure(config: pytest.Config) -> None:
    """In CI (``CALLBRIDGE_REQUIRE_PEERS=1``) a missing peer is an error, never a silent skip. The controller of a
    parallel run makes the bytecode the workers share (``tests/bytecode_cache.py``)."""
    if os.environ.get("CALLBRIDGE_REQUIRE_PEERS") == "1":
        missing = [f"{binary} (apt-get install {package})" for binary, package in PEERS.items() if peer_binary(binary) is None]
        missing += [f"libopus ({problem})" for problem in [opus_problem()] if problem is not None]
        if missing:
            raise pytest.UsageError(f"CALLBRIDGE_REQUIRE_PEERS=1 but missing: {', '.join(missing)}")
    if not hasattr(config, "workerinput") and config.getoption("numprocesses", None):
        cache_bytecode(config)  # once, before the workers start (each would rewrite every test module)

__all__ = ["NEEDS_LIBOPUS", "ServedBridge", "free_port", "peer_binary", "wait_http_ok"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each test marked ``long`` (15 s or more of real time) at the head of one worker's share: xdist's work-stealing
    schedule (``--dist worksteal``) gives each worker a contiguous share of the collection, so each long test starts
    at once beside the others, instead of several in one worker's share one after another, or one starting last and
    running alone at the end of the run. Every worker sorts the same collection the same way (the same count). The
    background tests get their hang guard, the real-time ones their second try (``tests/cpu_share.py``)."""
    give_background_tests_time(items)
    rerun_real_time_tests(items)
    long = [item for item in items if item.get_closest_marker("long") is not None]
    if not long:
        return
    rest = [item for item in items if item.get_closest_marker("long") is None]
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    shares = [rest[k * len(rest) // workers : (k + 1) * len(rest) // workers] for k in range(workers)]
    for n, item in enumerate(long):
        shares[n % workers].insert(n // workers, item)
    items[:] = [item for share in shares for item in share]


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    """How the test shares the cores with the others of a parallel run (``tests/cpu_share.py``)."""
    with sharing_the_cpu(item):
        yield


_PROBE_CORE = os.environ.get("CALLBRIDGE_PROBE_CORE") == "1"
"""Apply the core tier's guard to every test (to find the modules that could join the tier)."""


@pytest.fixture(autouse=True)
def _core_tests_touch_no_network_and_spawn_nothing(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The core tier (``pytest -m core``) is pure: a test marked ``core`` that binds or connects a socket, or starts
    a process, fails at that call. (Event loops' internal socket pairs are allowed: they are not the network.)"""
    if not (_PROBE_CORE or request.node.get_closest_marker("core")):
        return

    def refuse(what: str) -> Callable[..., None]:
        def refused(*args: object, **kwargs: object) -> None:
            raise AssertionError(f"a core test may not {what}: mark it otherwise, or make it pure")

        return refused

    for method in ("bind", "connect", "connect_ex", "sendto"):
        monkeypatch.setattr(socket.socket, method, refuse(f"{method} a socket"))
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse("start a process"))
    monkeypatch.setattr(os, "fork", refuse("fork"))


@dataclass
class ServedBridge:
    process: subprocess.Popen[str]
    base_url: str
    port: int


def wait_http_ok(url: str, process: subprocess.Popen[str], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited early with {process.returncode}: {process.stderr.read() if process.stderr else ''}")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{url} not up within {timeout_s} s")


@pytest.fixture(autouse=True)
def _logging_stays_the_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Logging is the run's, whatever a test did to it. A command run in this process (``main(["loadtest", …])``)
    configures logging as for a process of its own: structlog through the standard library at ``warning``, its
    loggers cached on first use; here that call changes nothing (the command's own logging is tested where it runs as
    a user runs it, in a subprocess: ``test_cli_mistakes.py``, ``served_bridge``; ``configure_logging`` itself in
    ``test_logging.py``, which holds the function, not the module's name). And structlog's configuration is put back
    after each test (the admission simulator's command filters below ``error``; ``test_logging.py`` configures it).
    Left as a test set it, every later test of that worker lost the log lines it reads from ``capsys``: the
    application-tool test failed both tries on such workers, eight parameters in one full run and three in a CI run."""
    monkeypatch.setattr("callbridge.logging.configure_logging", lambda *_args, **_kwargs: None)
    saved = structlog.get_config()
    yield
    if structlog.get_config() != saved:
        structlog.configure(**saved)


@pytest.fixture
def served_bridge() -> Iterator[ServedBridge]:
    """``python -m callbridge serve`` on a free loopback port, logging JSON to its stderr."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLBRIDGE_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "callbridge", "serve", "--port", str(port), "--log-format", "json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    bridge = ServedBridge(process, f"http://127.0.0.1:{port}", port)
    try:
        wait_http_ok(bridge.base_url + "/healthz", process)
        yield bridge
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
