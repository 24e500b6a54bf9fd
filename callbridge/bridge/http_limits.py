"""What an HTTP request may cost before anyone has checked who sent it (issue #15): a body cap, enforced while the
body is read rather than after.

Every webhook is read whole before its signature can be checked, so without a cap one unsigned POST of 100 MiB is
100 MiB of memory. ``BodyLimit`` (pure ASGI, around the whole app) answers 413 at once to a request whose
``Content-Length`` is over ``MAX_BODY_BYTES``, without reading it, and to one whose body grows past it as it
is read (chunked, or lying about its length), stopping there; uvicorn then closes the connection rather than
read the rest. A client that goes away mid-body is logged at info, not as the application error (a traceback)
Starlette's ``ClientDisconnect`` would otherwise be.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import ClientDisconnect, Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from callbridge.logging import get_logger

__all__ = ["MAX_BODY_BYTES", "BodyLimit", "read_body"]

log = get_logger(__name__)

MAX_BODY_BYTES: Final = 256 * 1024
"""The largest request body any endpoint takes: a carrier's webhook is a few KiB of form or JSON."""


async def read_body(request: Request, max_bytes: int) -> bytes | None:
    """The request's body, read as it comes; None as soon as it is over ``max_bytes`` (the rest is not read): a route's
    own cap, under the app's ``MAX_BODY_BYTES``."""
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            return None
    return bytes(body)


class BodyLimit:
    """413 for a request body over ``max_bytes``, decided before (``Content-Length``) or while it is read."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, send, f"Content-Length {declared}")
            return
        read = 0
        over = False
        started = False

        async def limited_receive() -> Message:
            nonlocal read, over
            if over:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                read += len(message.get("body", b""))
                if read > self.max_bytes:
                    over = True  # the app sees the client gone; this answers 413 instead
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except ClientDisconnect:
            if not over:
                log.info("request_abandoned", path=scope.get("path"), detail="the client went away before its body was read")
                return
        if over and not started:
            await self._refuse(scope, send, f"more than {self.max_bytes} bytes read")

    async def _refuse(self, scope: Scope, send: Send, detail: str) -> None:
        log.warning("request_refused", path=scope.get("path"), reason="body_too_large", limit=self.max_bytes, detail=detail)
        body = b"request body too large\n"
        headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None  # h11 refuses a malformed one before the app sees it
    return None
