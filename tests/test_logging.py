"""Logging: JSON lines with the call bound, console output, the level from config."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from callbridge.config import LogFormat, LogSettings
from callbridge.logging import call_logger, configure_logging, get_logger

pytestmark = pytest.mark.core


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_the_call() -> None:
    out = io.StringIO()
    configure_logging(LogSettings(level="info", format=LogFormat.JSON), out)
    log = call_logger("CA123", "twilio").bind(session_id="sess-1")
    log.info("call_started", stream_sid="MZ1")
    call_logger("CA999", "telnyx").warning("call_ended", reason="hangup")
    first, second = lines(out)
    assert first["event"] == "call_started"
    assert first["call_id"] == "CA123" and first["provider"] == "twilio" and first["session_id"] == "sess-1"
    assert first["stream_sid"] == "MZ1" and first["level"] == "info"
    assert "timestamp" in first
    assert second["call_id"] == "CA999" and "session_id" not in second and second["level"] == "warning"


def test_level_from_config_filters() -> None:
    out = io.StringIO()
    configure_logging(LogSettings(level="warning", format=LogFormat.JSON), out)
    log = get_logger("callbridge.test")
    log.debug("hidden")
    log.info("hidden")
    log.warning("shown")
    assert [line["event"] for line in lines(out)] == ["shown"]


def test_stdlib_records_share_the_format() -> None:
    out = io.StringIO()
    configure_logging(LogSettings(format=LogFormat.JSON), out)
    logging.getLogger("uvicorn.error").info("Started server process")
    (line,) = lines(out)
    assert line["event"] == "Started server process" and line["logger"] == "uvicorn.error"


def test_exceptions_rendered_in_json() -> None:
    out = io.StringIO()
    configure_logging(LogSettings(format=LogFormat.JSON), out)
    try:
        raise KeyError("boom")
    except KeyError:
        get_logger("t").exception("failed")
    (line,) = lines(out)
    assert "KeyError" in str(line["exception"])


def test_console_format_is_readable() -> None:
    out = io.StringIO()
    configure_logging(LogSettings(format=LogFormat.CONSOLE), out)
    call_logger("CA1", "plivo").info("call_started")
    text = out.getvalue()
    assert "call_started" in text and "call_id=CA1" in text and "provider=plivo" in text
    assert not text.startswith("{")


def test_auto_is_json_when_not_a_terminal() -> None:
    out = io.StringIO()
    configure_logging(LogSettings(format=LogFormat.AUTO), out)
    get_logger("t").info("x")
    assert lines(out)[0]["event"] == "x"
