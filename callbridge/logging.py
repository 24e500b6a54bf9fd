"""structlog set-up: JSON lines in production, readable console lines in development.

Everything logs through the standard library's root handler, so uvicorn's and
other libraries' records come out in the same format as ours. Per-call loggers
carry the call id, the provider and, once the engine session opens, its
session id (``call_logger(...).bind(session_id=...)``); several calls share one
event loop, so the ids are bound on the logger, not in context variables.

Per-frame code must not log unconditionally: guard with a flag computed once
(``logger.isEnabledFor``-style), as websockets does with ``self.debug``.
"""

from __future__ import annotations

import enum
import logging
import sys
from typing import Any, Final, Protocol, TextIO

import orjson
import structlog

__all__ = ["LogFormat", "LogOptions", "call_logger", "configure_logging", "get_logger"]


class LogFormat(enum.Enum):
    AUTO = "auto"  # console on a terminal, JSON lines otherwise
    JSON = "json"
    CONSOLE = "console"


class LogOptions(Protocol):
    """What the set-up reads of the settings (``[log]``: ``config.LogSettings``): taken as this, so that logging
    imports nothing of the configuration (the engine client gets a logger without the whole settings schema)."""

    @property
    def level(self) -> str: ...

    @property
    def format(self) -> LogFormat: ...


_LEVELS: Final = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def _orjson_dumps(event: Any, **_: Any) -> str:
    return orjson.dumps(event, default=str).decode()


def configure_logging(settings: LogOptions, stream: TextIO | None = None) -> None:
    """Route structlog and stdlib logging to ``stream`` (stderr) in the configured format and level.

    Call once at process start, before the first log line; calling again replaces the set-up.
    """
    stream = stream if stream is not None else sys.stderr
    fmt = settings.format
    if fmt is LogFormat.AUTO:
        fmt = LogFormat.CONSOLE if stream.isatty() else LogFormat.JSON

    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.types.Processor
    if fmt is LogFormat.JSON:
        renderer = structlog.processors.JSONRenderer(serializer=_orjson_dumps)
        shared.append(structlog.processors.format_exc_info)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=stream.isatty())

    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_LEVELS[settings.level])
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A logger for a module (``get_logger(__name__)``)."""
    logger: structlog.stdlib.BoundLogger = structlog.stdlib.get_logger(name)
    return logger


def call_logger(call_id: str, provider: str, session_id: str | None = None) -> structlog.stdlib.BoundLogger:
    """A logger bound to one call: every line carries ``call_id`` and ``provider`` (and ``session_id``)."""
    logger = get_logger("callbridge.call").bind(call_id=call_id, provider=provider)
    if session_id is not None:
        logger = logger.bind(session_id=session_id)
    return logger
