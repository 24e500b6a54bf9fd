"""The carrier's media connection as the driver (``media.py``) reads and writes it, already accepted: a websocket,
a call's RTP socket, a TCP stream of frames."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, Literal, Protocol, TypeVar, runtime_checkable

from starlette.websockets import WebSocket, WebSocketState

from callbridge.application.events import MediaQuality
from callbridge.bridge.ws_protocol import DATA_FRAMES_EXTENSION, DataFramesWriter, allow_messages_up_to
from callbridge.stall import PROCESS_STALL_MS

__all__ = [
    "BatchingTransport", "CarrierTransport", "MeasuredTransport", "SizeLimitedTransport", "TranscriptTransport", "WebSocketTransport",
    "receive_within",
]  # fmt: skip

T = TypeVar("T")

_MESSAGE_TOO_BIG: Final = 1009


class CarrierTransport(Protocol):
    """The carrier's media connection, already accepted."""

    async def receive(self) -> str | bytes | None:
        """The next message (text or binary; a chunk of the stream for TCP); None once the peer has gone."""
        ...

    async def send(self, message: str | bytes) -> None: ...

    async def close(self, code: int) -> None:
        """Close (idempotent); ``code`` is the websocket close code where there is one."""
        ...


@runtime_checkable
class BatchingTransport(Protocol):
    """A carrier transport that can write several messages at once (a websocket: one system call for a reply's
    audio and the marker after it, where ``send`` makes one each)."""

    async def send_many(self, messages: Sequence[str | bytes]) -> None:
        """``messages``, in order, as ``send`` would send each."""
        ...


@runtime_checkable
class MeasuredTransport(Protocol):
    """A carrier transport that sees the network its media crosses (SIP's RTP: jitter, loss, round trip): the figures
    go in the call's report (``CallReport.media``) and the metrics."""

    def media_quality(self) -> MediaQuality | None:
        """The call's codec, encryption and line figures now; None where its media never started."""
        ...


@runtime_checkable
class TranscriptTransport(Protocol):
    """A carrier transport with a screen (the browser phone): what the engine transcribes of the conversation, as it
    comes, where the engine gives it (the agent's replies; the caller's words where its model transcribes them)."""

    def transcript(self, who: Literal["agent", "caller"], text: str, item_id: str | None) -> None:
        """A piece of the agent's reply ``item_id`` (a delta), or a line the caller said (whole); never waits."""
        ...


@runtime_checkable
class SizeLimitedTransport(Protocol):
    """A carrier transport whose messages are limited in size before they are read (a websocket: ``ws_protocol``)."""

    @property
    def refused_too_large(self) -> bool:
        """It ended because a message was over the limit (refused unread)."""
        ...

    async def authenticated(self, max_message_bytes: int) -> None:
        """The stream is the carrier's: its messages may now be as large as ``max_message_bytes``."""
        ...


class WebSocketTransport:
    """A Starlette websocket, accepted, as a ``CarrierTransport``.

    Messages go straight to the ASGI ``receive``/``send`` the websocket was given: Starlette's per-message state
    checks cost more than the message's own handling. Its state is kept where it changes: a disconnect read here,
    and the close (which goes through the websocket). Under ``ws_protocol``'s protocol what is sent is written
    to the socket directly, several messages in one write (``DATA_FRAMES_EXTENSION``), while the connection is
    open for data; otherwise (closing, a full write buffer, another server) it goes the ASGI way."""

    def __init__(self, websocket: WebSocket) -> None:
        self.websocket = websocket
        self._receive = websocket._receive
        self._send = websocket._send
        frames = websocket.scope.get("extensions", {}).get(DATA_FRAMES_EXTENSION)
        self._write_now: DataFramesWriter | None = frames["write"] if frames else None
        self.refused_too_large = False
        """The connection ended because the protocol refused a message over its limit (``ws_protocol``): 1009."""
        self.peer = websocket.client.host if websocket.client is not None else None
        """The address the connection came from (a load balancer's, behind one)."""

    async def receive(self) -> str | bytes | None:
        if self.websocket.client_state is not WebSocketState.CONNECTED:
            return None
        try:
            message = await self._receive()
        except (OSError, RuntimeError):
            return None
        if message["type"] != "websocket.receive":
            self.websocket.client_state = WebSocketState.DISCONNECTED
            self.refused_too_large = message.get("code") == _MESSAGE_TOO_BIG
            return None
        text = message.get("text")
        return text if text is not None else message.get("bytes") or b""

    async def send(self, message: str | bytes) -> None:
        await self.send_many((message,))

    async def send_many(self, messages: Sequence[str | bytes]) -> None:
        if self.websocket.application_state is not WebSocketState.CONNECTED:
            raise RuntimeError("the websocket is closed")
        if self._write_now is None or not self._write_now(messages):
            for message in messages:
                await self._send({"type": "websocket.send", "text": message} if isinstance(message, str) else {"type": "websocket.send", "bytes": message})

    async def close(self, code: int) -> None:
        if self.websocket.application_state is not WebSocketState.DISCONNECTED:
            await self.websocket.close(code)

    async def authenticated(self, max_message_bytes: int) -> None:
        """The stream is the carrier's: its messages may be as large as its codec accepts (``ws_protocol``)."""
        if self.websocket.application_state is WebSocketState.CONNECTED:
            await allow_messages_up_to(self.websocket, max_message_bytes)


async def receive_within(receive: Callable[[], Awaitable[T]], timeout_s: float | None) -> T:
    """``receive()``, or ``TimeoutError`` when nothing came within ``timeout_s`` (None: no limit): the silence limit of
    a transport that keeps its own (a call's RTP socket, a TCP stream of frames).

    But a time-out that comes at least ``PROCESS_STALL_MS`` after its deadline means this process did not run
    meanwhile (stopped, swapped out, its VM frozen): the peer's packets of that time may sit unread in the socket,
    and after a stall the event loop runs its timers before it reads the sockets. Then ``receive`` gets
    ``PROCESS_STALL_MS`` more, once, to read them: the peer is not blamed for this process's silence (the call
    core's limits wait for the reader the same way)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout_s is None else loop.time() + timeout_s
    try:
        async with asyncio.timeout_at(deadline):
            return await receive()
    except TimeoutError:
        if deadline is None or loop.time() - deadline < PROCESS_STALL_MS / 1000:
            raise
    async with asyncio.timeout(PROCESS_STALL_MS / 1000):
        return await receive()
