"""uvicorn's HTTP protocol (httptools), with budgets for what a connection costs before its request head is in
(issue #15): nothing unauthenticated costs much.

uvicorn has no deadline for a request head (a connection that sends nothing, or a header line every few
seconds, is kept for ever: slowloris) and, with httptools, no limit on a head's size or its number of headers.
Here, until a connection's request head is complete:

- it has ``REQUEST_HEAD_TIMEOUT_S`` (from the connection, or from the first byte of a keep-alive connection's
  next request) — then 408 and closed;
- its head may be at most ``MAX_HEAD_BYTES`` (the request line and the headers) and ``MAX_HEADERS`` headers —
  then 431 and closed, before the app sees any of it;
- it counts as pending: a source with ``MAX_PENDING_PER_SOURCE`` heads pending for over ``SLOW_HEAD_S``
  (a burst of honest connections is read in well under that) has a new connection closed at once; and the
  process holds at most ``MAX_PENDING`` pending heads, or a quarter of its file descriptor limit where that is
  fewer: at the cap, the head pending longest is answered 408 and closed to make room for the new connection
  (an honest head is read in milliseconds; the oldest is a slow one's). So slow connections, from one source
  or many, never hold the file descriptors a carrier's signed request needs.

A websocket upgrade is a request head like any other: the same budgets hold until it is upgraded.
``http_protocol_class()`` checks that uvicorn's class is the one this was written against and falls back to
uvicorn's choice ("auto") when it is not.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Final

from callbridge.bridge.ws_protocol import MAX_UNAUTHENTICATED, unauthenticated_cap, websocket_options
from callbridge.logging import get_logger

__all__ = [
    "MAX_HEADERS",
    "MAX_HEAD_BYTES",
    "MAX_PENDING",
    "MAX_PENDING_PER_SOURCE",
    "REQUEST_HEAD_TIMEOUT_S",
    "SLOW_HEAD_S",
    "http_protocol_class",
    "serving_options",
]

log = get_logger(__name__)

REQUEST_HEAD_TIMEOUT_S: Final = 10.0
MAX_HEAD_BYTES: Final = 32 * 1024
"""A carrier's webhook head (its signature, a JWT, forwarded-for headers) takes a few KiB."""
MAX_HEADERS: Final = 100
MAX_PENDING_PER_SOURCE: Final = 64
"""Connections from one address whose request head has been pending over ``SLOW_HEAD_S``. Carriers send from
many addresses, each a few requests at a time, and a load balancer sends whole heads at once."""
SLOW_HEAD_S: Final = 1.0
MAX_PENDING: Final = MAX_UNAUTHENTICATED
"""Pending request heads held at most (fewer with a file descriptor limit under four times as many)."""
_LOG_EVERY_S: Final = 1.0


class _Quiet:
    """One log line a second per event at most, with how many were left out since the last."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._left_out: Counter[str] = Counter()

    def warning(self, event: str, **fields: Any) -> None:
        now = time.monotonic()
        if now - self._last.get(event, -_LOG_EVERY_S) < _LOG_EVERY_S:
            self._left_out[event] += 1
            return
        self._last[event] = now
        log.warning(event, left_out=self._left_out.pop(event, 0), **fields)


def serving_options(*, bridge: bool = True) -> dict[str, Any]:
    """The protocol settings of ``uvicorn.Config``, the same for ``callbridge serve`` and the simulators;
    ``bridge``: False for an engine server (its sockets are the bridge's own sessions, not carriers' streams)."""
    return {"http": http_protocol_class(), **websocket_options(bridge=bridge)}


def http_protocol_class() -> Any:
    """The protocol class for ``uvicorn.Config(http=...)``: httptools' with the budgets above, or ``"auto"``.
    Each call makes a class of its own, with its own count of pending heads (one per server)."""
    try:
        import httptools
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return "auto"
    needed = (
        "connection_made", "connection_lost", "on_message_begin", "on_url", "on_header", "on_headers_complete",
        "_unset_keepalive_if_required", "_should_upgrade", "handle_websocket_upgrade", "_unsupported_upgrade_warning",
        "send_400_response",
    )  # fmt: skip
    if not all(callable(getattr(HttpToolsProtocol, name, None)) for name in needed):
        log.warning("http_budgets_off", detail="uvicorn's httptools protocol is not the expected one")
        return "auto"
    heads = _PendingHeads(unauthenticated_cap(), httptools.HttpParserError, httptools.HttpParserUpgrade)
    return type("BudgetedHttpProtocol", (_HeadBudgets, HttpToolsProtocol), {"_heads": heads})


class _PendingHeads:
    """One server's connections whose request head is pending, by source, and since when (``time.monotonic``)."""

    def __init__(self, cap: int, parser_error: type[Exception], parser_upgrade: type[Exception]) -> None:
        self.by_source: dict[str, dict[Any, float]] = {}
        self.cap = cap
        self.quiet = _Quiet()
        self.parser_error = parser_error
        self.parser_upgrade = parser_upgrade

    def slow_from(self, source: str, now: float) -> int:
        return sum(1 for since in self.by_source.get(source, {}).values() if now - since > SLOW_HEAD_S)

    def full(self) -> bool:
        return sum(map(len, self.by_source.values())) >= self.cap

    def oldest(self) -> Any:
        return min((since, id(conn), conn) for heads in self.by_source.values() for conn, since in heads.items())[2]

    def add(self, source: str, conn: Any) -> None:
        self.by_source.setdefault(source, {})[conn] = time.monotonic()

    def remove(self, source: str, conn: Any) -> None:
        waiting = self.by_source.get(source, {})
        waiting.pop(conn, None)
        if not waiting:
            self.by_source.pop(source, None)


if TYPE_CHECKING:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _HttpBase
else:
    _HttpBase = object


class _HeadBudgets(_HttpBase):
    """uvicorn's httptools protocol (the class after this one in ``http_protocol_class``'s), with a deadline,
    size limits and a pending count for request heads. ``_heads`` is the server's, set on the class made."""

    _heads: _PendingHeads

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._source = self.client[0] if self.client else ""
        self._pending = False
        self._head_timer: Any = None
        self._head_bytes = 0
        self._head_headers = 0
        self._too_large = False
        heads = self._heads
        slow = heads.slow_from(self._source, time.monotonic())
        if slow >= MAX_PENDING_PER_SOURCE:
            heads.quiet.warning("connection_refused", reason="too_many_pending_heads", peer=self._source, slow_heads=slow)
            transport.abort()
            return
        if heads.full():  # room for this one: the longest pending goes
            oldest = heads.oldest()
            heads.quiet.warning("request_refused", reason="pending_heads_full", peer=oldest._source, pending=heads.cap)
            oldest._refuse(408, b"request head not received in time\n")
        self._begin_head()

    def _begin_head(self) -> None:
        if not self._pending:
            self._pending = True
            self._heads.add(self._source, self)
        self._head_bytes = self._head_headers = 0
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(REQUEST_HEAD_TIMEOUT_S, self._head_timed_out)

    def _end_head(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        if self._pending:
            self._pending = False
            self._heads.remove(self._source, self)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        self._heads.quiet.warning("request_refused", reason="head_timeout", peer=self._source, timeout_s=REQUEST_HEAD_TIMEOUT_S)
        self._refuse(408, b"request head not received in time\n")

    def _refuse(self, status: int, body: bytes) -> None:
        from uvicorn.protocols.http.httptools_impl import STATUS_LINE

        self._end_head()
        if not self.transport.is_closing():
            head = STATUS_LINE[status] + b"content-type: text/plain\r\nconnection: close\r\ncontent-length: %d\r\n\r\n" % len(body)
            self.transport.write(head + body)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._end_head()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """uvicorn's, but a head over its budget is answered 431 (the parser stopped at its header)."""
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except self._heads.parser_error:
            if not self._too_large:
                self.logger.warning("Invalid HTTP request received.")
                self.send_400_response("Invalid HTTP request received.")
                return
            self._heads.quiet.warning("request_refused", reason="head_too_large", peer=self._source, head_bytes=self._head_bytes, headers=self._head_headers)
            self._refuse(431, b"request head too large\n")
        except self._heads.parser_upgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._begin_head()  # a keep-alive connection's next request: from its first byte

    def on_url(self, url: bytes) -> None:
        self._count(len(url), 0)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4, 1)
        super().on_header(name, value)

    def _count(self, size: int, headers: int) -> None:
        """Raising stops the parser there (``data_received`` answers 431): the app never sees the request."""
        self._head_bytes += size
        self._head_headers += headers
        if self._head_bytes > MAX_HEAD_BYTES or self._head_headers > MAX_HEADERS:
            self._too_large = True
            raise ValueError("request head over its budget")

    def on_headers_complete(self) -> None:
        self._end_head()
        super().on_headers_complete()
