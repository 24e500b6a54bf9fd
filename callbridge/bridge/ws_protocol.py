"""uvicorn's websocket protocol (``websockets-sansio``), with less work per message on an open connection.

Why: a call moves about 1.2 websocket messages each way every 20 ms, and at 100 calls the per-message work of
the protocol layer under the app was a fifth of the bridge's CPU (``bench/RESULTS.md``). Two costs go:

- Sending: on an open, uncompressed connection a data message is one frame, unmasked (server to client) and
  unfragmented: its header is two to ten bytes written in front of the payload, without websockets' ``Frame``
  objects, serializer and output buffer. Anything else (the handshake, a close, a connection that is closing,
  compressed or waiting for its write buffer to drain) takes uvicorn's own path. The app may also write data
  messages itself, several in one write (``DATA_FRAMES_EXTENSION``): a reply's audio and its marker go out in
  one system call instead of two (the socket writes were a quarter of the bridge's CPU at 100 calls on loopback,
  ``bench/RESULTS.md``), and without the ASGI ``send`` chain under them.
- Receiving: uvicorn pauses the socket's reading after every message it queues for the app and resumes it
  when the app takes it (two changes to the event loop's poller per message). Here reading pauses only when
  ``_PAUSE_AT`` messages are waiting: the app still bounds what it buffers, but not one message at a time.

Parsing inbound frames stays websockets' own (its parser state is not ours to skip). Built on uvicorn's
internals: ``protocol_class()`` checks that they are the ones this was written against and falls back to
uvicorn's class, unchanged, when they are not.

And nothing unauthenticated costs much: until the stream has shown it is the carrier's (its token, or the
credentials of its upgrade), a message may be at most ``PRE_AUTH_MAX_MESSAGE_BYTES``; then at most what the
carrier's codec accepts (``allow_messages_up_to``), never past ``MAX_MESSAGE_BYTES``. websockets checks the
limit against each frame's header (and a fragmented message's running size) before it reads the payload, so a
message over it is refused (close 1009) without being buffered.

And a socket that is open but not yet the carrier's holds a file descriptor: a bridge's protocol
(``websocket_options(bridge=True)``) counts them, from the handshake until the app raises the message limit,
and holds at most ``unauthenticated_cap()``; at the cap the one waiting longest is cut (aborted: a hostile peer
never answers a close) to make room, so a carrier's new stream always gets in. Each is also bounded in time,
by the app's first-message deadline. An engine server's sockets (the bridge's own sessions) are not counted.
"""

from __future__ import annotations

import resource
import struct
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from callbridge.logging import get_logger

__all__ = [
    "CLOSE_REPLY_WAIT_S",
    "DATA_FRAMES_EXTENSION",
    "DataFramesWriter",
    "MAX_MESSAGE_BYTES",
    "MESSAGE_LIMIT_EXTENSION",
    "PRE_AUTH_MAX_MESSAGE_BYTES",
    "allow_messages_up_to",
    "frame_header",
    "protocol_class",
    "unauthenticated_cap",
    "websocket_options",
]

log = get_logger(__name__)

PRE_AUTH_MAX_MESSAGE_BYTES: Final = 16 * 1024
"""The largest message a stream may send before it is known to be the carrier's: a carrier's first messages
(a ``connected`` and a ``start`` with its custom parameters, or one ``connected`` with the
call's headers) and the media that follows them while the token is checked take a few KiB at most."""
MAX_MESSAGE_BYTES: Final = 256 * 1024
"""The largest message any carrier's codec accepts (the JSON carriers'; binary-audio carriers' are smaller)."""
MESSAGE_LIMIT_EXTENSION: Final = "callbridge.message_limit"
"""The ASGI extension (in the websocket's scope) and message type by which the app raises a connection's limit."""
DATA_FRAMES_EXTENSION: Final = "callbridge.data_frames"
"""The ASGI extension (in the websocket's scope) by which the app writes data messages itself: its ``"write"``
(``DataFramesWriter``) writes them as frames, all in one write, while the connection is open for data, and says
whether it did (False: nothing written; send them the ASGI way, which waits for a full write buffer to drain)."""
DataFramesWriter = Callable[[Sequence[str | bytes]], bool]
"""``DATA_FRAMES_EXTENSION``'s ``"write"``: text messages go as text frames, bytes as binary ones."""
_PAUSE_AT: Final = 32
"""Messages waiting for the app before the socket's reading is paused."""
_TEXT: Final = 0x81
"""FIN + text opcode."""
_BINARY: Final = 0x82
_SHORT: Final = struct.Struct("!BBH")
_LONG: Final = struct.Struct("!BBQ")


def frame_header(first_byte: int, length: int) -> bytes:
    """The header of one unmasked frame of ``length`` payload bytes (RFC 6455 §5.2)."""
    if length < 126:
        return bytes((first_byte, length))
    if length < 1 << 16:
        return _SHORT.pack(first_byte, 126, length)
    return _LONG.pack(first_byte, 127, length)


CLOSE_REPLY_WAIT_S: Final = 2.0
"""How long a socket we closed waits for the peer's close before its TCP connection is closed anyway: a carrier
answers in milliseconds; a hostile peer never does, and would hold the descriptor (uvicorn waits 10 s)."""
MAX_UNAUTHENTICATED: Final = 512
"""Connections not yet authenticated held at most, of each kind (request heads; open sockets): fewer with a file
descriptor limit under four times as many (``unauthenticated_cap``)."""


def unauthenticated_cap() -> int:
    """``MAX_UNAUTHENTICATED``, or a quarter of the process's file descriptor limit where that is fewer (at least
    8): the heads and the sockets not yet authenticated hold at most half of the descriptors between them."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_UNAUTHENTICATED if soft == resource.RLIM_INFINITY else max(8, min(MAX_UNAUTHENTICATED, soft // 4))


def websocket_options(*, bridge: bool = True) -> dict[str, Any]:
    """The websocket settings of ``uvicorn.Config``, the same for ``callbridge serve`` and the simulators;
    ``bridge``: carriers' sockets, counted until they are authenticated (not an engine server's)."""
    return {
        "ws": protocol_class(count_unauthenticated=bridge),
        "ws_max_size": MAX_MESSAGE_BYTES,  # uvicorn's own protocol, where ours is off: one limit, authenticated or not
        "ws_per_message_deflate": False,  # audio does not compress; deflate only costs CPU per frame
    }


async def allow_messages_up_to(websocket: Any, max_bytes: int) -> None:
    """The stream ``websocket`` (a Starlette ``WebSocket``) is authenticated: its messages may be up to
    ``max_bytes`` from now on (at most uvicorn's ``ws_max_size``). Nothing where the protocol is uvicorn's own."""
    if MESSAGE_LIMIT_EXTENSION in websocket.scope.get("extensions", {}):
        await websocket._send({"type": MESSAGE_LIMIT_EXTENSION, "max_bytes": max_bytes})


def protocol_class(*, count_unauthenticated: bool = True) -> Any:
    """The protocol class for ``uvicorn.Config(ws=...)``: the lighter one, or ``"websockets-sansio"`` (uvicorn's
    own) when the installed uvicorn is not the one it was written against."""
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
        from websockets.protocol import State
    except ImportError:
        return "websockets-sansio"
    expected = ("send", "receive", "send_receive_event_to_app", "handle_connect", "handle_events", "handle_parser_exception")
    if not all(callable(getattr(WebSocketsSansIOProtocol, name, None)) for name in expected):
        log.warning("websocket_fast_path_off", detail="uvicorn's websockets-sansio protocol is not the expected one")
        return "websockets-sansio"

    unauthenticated = _Unauthenticated(unauthenticated_cap(), counted=count_unauthenticated)
    state = {"_unauthenticated": unauthenticated, "_open": State.OPEN}
    return type("MediaWebSocketProtocol", (_MediaFrames, WebSocketsSansIOProtocol), state)


class _Unauthenticated:
    """One server's open sockets not yet authenticated → since when (``time.monotonic``), oldest first;
    ``counted`` False for an engine server's (the bridge's own sessions)."""

    def __init__(self, cap: int, *, counted: bool) -> None:
        self.sockets: dict[Any, float] = {}
        self.cap = cap
        self.counted = counted
        self._last_logged = 0.0

    def add(self, socket: Any) -> None:
        now = time.monotonic()
        if len(self.sockets) >= self.cap:  # room for this one: the one waiting longest is cut
            oldest, since = next(iter(self.sockets.items()))
            del self.sockets[oldest]
            if now - self._last_logged >= 1.0:  # one line a second at most
                self._last_logged = now
                log.warning("websocket_cut", reason="unauthenticated_full", held=self.cap, waited_s=round(now - since, 3))
            oldest.transport.abort()
        self.sockets[socket] = now


if TYPE_CHECKING:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol as _WsBase
else:
    _WsBase = object


class _MediaFrames(_WsBase):
    """uvicorn's protocol; data frames written directly, reading paused only past ``_PAUSE_AT`` waiting; a
    message limit that starts at ``PRE_AUTH_MAX_MESSAGE_BYTES`` and is raised once the stream is the carrier's;
    at most ``cap`` open before that (``_unauthenticated``: the server's, set on the class ``protocol_class``
    makes, whose next base is uvicorn's)."""

    _unauthenticated: _Unauthenticated
    _open: Any
    """websockets' ``State.OPEN`` (read on every write: a class attribute, not a chain)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._max_bytes = self.config.ws_max_size  # the ceiling (``websocket_options``: ``MAX_MESSAGE_BYTES``)
        self.conn.max_message_size = min(self._max_bytes, PRE_AUTH_MAX_MESSAGE_BYTES)
        self.close_timeout = CLOSE_REPLY_WAIT_S  # uvicorn's: 10 s

    def connection_lost(self, exc: Exception | None) -> None:
        self._unauthenticated.sockets.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """As uvicorn's, but the messages parsed before a frame the parser refused (over the limit) reach the
        app before the disconnect: uvicorn's drops them (a carrier's ``start`` and then a message too big
        would end a stream whose call the app never learned of)."""
        self.conn.receive_data(data)
        self.handle_events()
        if self.conn.parser_exc is not None:
            self.handle_parser_exception()

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None:
            scope["extensions"][MESSAGE_LIMIT_EXTENSION] = {}
            scope["extensions"][DATA_FRAMES_EXTENSION] = {"write": self.write_data_now}
            if self._unauthenticated.counted:
                self._unauthenticated.add(self)

    async def send(self, message: Any) -> None:
        if message["type"] == MESSAGE_LIMIT_EXTENSION:  # the stream is the carrier's
            self.conn.max_message_size = max(PRE_AUTH_MAX_MESSAGE_BYTES, min(int(message["max_bytes"]), self._max_bytes))
            self._unauthenticated.sockets.pop(self, None)
            return
        if message["type"] == "websocket.send":
            data = message.get("text")
            if data is None:
                data = message.get("bytes")
            if data is not None and self.write_data_now((data,)):
                return
        await super().send(message)

    def write_data_now(self, messages: Sequence[str | bytes]) -> bool:
        """``messages`` as data frames in one write, if the connection is open for data; else False, nothing
        written (``DATA_FRAMES_EXTENSION``)."""
        if not self._open_for_data():
            return False
        parts: list[bytes] = []
        for message in messages:
            if isinstance(message, str):
                payload = message.encode()
                parts.append(frame_header(_TEXT, len(payload)))
            else:
                payload = message
                parts.append(frame_header(_BINARY, len(payload)))
            parts.append(payload)
        self.transport.write(b"".join(parts))
        return True

    def _open_for_data(self) -> bool:
        conn = self.conn
        return bool(
            self.handshake_complete
            and not self.disconnected
            and not self.close_sent
            and self.initial_response is None
            and self.writable.is_set()
            and conn.state is self._open
            and not conn.extensions
        )

    def send_receive_event_to_app(self) -> None:
        data = self.frames[0] if len(self.frames) == 1 else b"".join(self.frames)
        self.frames = []
        if self.close_sent:  # past the app's close: dropped, reading goes on until the peer's close reply
            return
        if self.curr_msg_data_type == "text":
            try:
                self.queue.put_nowait({"type": "websocket.receive", "text": data.decode()})
            except UnicodeDecodeError:
                self.logger.warning("Invalid UTF-8 sequence received from client.")
                self.conn.send_close(1007)
                self.handle_parser_exception()
                return
        else:
            self.queue.put_nowait({"type": "websocket.receive", "bytes": data})
        if not self.read_paused and self.queue.qsize() >= _PAUSE_AT:
            self.read_paused = True
            self.transport.pause_reading()
