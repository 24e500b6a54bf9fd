"""A process told to stop while it is still starting stops cleanly: a bridge's server (its exit code 0, not the
startup failure's 1), and a ``serve --workers`` group whose replacement worker was still in its imports."""

from __future__ import annotations

import signal

import pytest
import uvicorn

from callbridge.serving import _draining_server
from callbridge.workers import group_exit_code

pytestmark = pytest.mark.core


async def _app(scope: object, receive: object, send: object) -> None:
    raise AssertionError("never called")


def test_a_signal_before_startup_is_a_stop_not_a_failure() -> None:
    server = _draining_server(uvicorn, None)(uvicorn.Config(_app))
    assert not server.stopped_while_starting
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and server.stopped_while_starting


def test_a_signal_once_started_is_not_taken_for_one_while_starting() -> None:
    server = _draining_server(uvicorn, None)(uvicorn.Config(_app))
    server.started = True
    server.handle_exit(signal.SIGTERM, None)
    assert server.should_exit and not server.stopped_while_starting


@pytest.mark.parametrize(
    ("exit_codes", "expected"),
    [
        ([0, 0], 0),
        ([-signal.SIGTERM, 0], 0),  # a replacement worker still in its imports when the group was stopped
        ([1, 0], 1),  # a worker whose startup failed
        ([-signal.SIGKILL, 0], 1),
        ([-signal.SIGSEGV, 0], 1),
        ([None, 0], 1),
    ],
)
def test_the_group_exits_0_only_where_each_worker_stopped_as_told(exit_codes: list[int | None], expected: int) -> None:
    assert group_exit_code(exit_codes) == expected
