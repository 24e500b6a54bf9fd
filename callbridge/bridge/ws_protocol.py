"""uvicorn's websocket protocol (``websockets-sansio``), with less work per message on an open connection.

Why: a call moves about 1.2 websocket messages each way every 20 ms, and at 100 calls the per-message work of
the protocol layer under the app was a fifth of the bridge's CPU (``bench/RESULTS.md``). Two costs go:

- Sending: on an open, uncompressed connection a data message is one frame, unmasked (server to client) and
  unfragmented: its header is two to ten bytes written in front of the payload, without websockets' ``Frame``
  objects, serializer and output buffer. Anything else (the handshake, a close, a connection that is closing,
  compressed or waiting for its write buffer to drain) takes uvicorn's own path.
- Receiving: uvicorn pauses the socket's reading after every message it queues for the app and resumes it
  when the app takes it (two changes to the event loop's poller per message). Here reading pauses only when
  ``_PAUSE_AT`` messages are waiting: the app still bounds what it buffers, but not one message at a time.

Parsing inbound frames stays websockets' own (its parser state is not ours to skip). Built on uvicorn's
internals: ``protocol_class()`` checks that they are the ones this was written against and falls back to
uvicorn's class, unchanged, when they are not.
"""

from __future__ import annotations

import struct
from typing import Any, Final

from callbridge.logging import get_logger

__all__ = ["frame_header", "protocol_class"]

log = get_logger(__name__)

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


def protocol_class() -> Any:
    """The protocol class for ``uvicorn.Config(ws=...)``: the lighter one, or ``"websockets-sansio"`` (uvicorn's
    own) when the installed uvicorn is not the one it was written against."""
    try:
        from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
        from websockets.protocol import State
    except ImportError:
        return "websockets-sansio"
    if not all(callable(getattr(WebSocketsSansIOProtocol, name, None)) for name in ("send", "receive", "send_receive_event_to_app")):
        log.warning("websocket_fast_path_off", detail="uvicorn's websockets-sansio protocol is not the expected one")
        return "websockets-sansio"

    class MediaWebSocketProtocol(WebSocketsSansIOProtocol):
        """uvicorn's protocol; data frames written directly, reading paused only past ``_PAUSE_AT`` waiting."""

        async def send(self, message: Any) -> None:
            if message["type"] == "websocket.send" and self._open_for_data():
                text = message.get("text")
                if text is not None:
                    payload = text.encode()
                    self.transport.write(frame_header(_TEXT, len(payload)) + payload)
                    return
                data = message.get("bytes")
                if data is not None:
                    self.transport.write(frame_header(_BINARY, len(data)) + data)
                    return
            await super().send(message)

        def _open_for_data(self) -> bool:
            conn = self.conn
            return bool(
                self.handshake_complete
                and not self.disconnected
                and not self.close_sent
                and self.initial_response is None
                and self.writable.is_set()
                and conn.state is State.OPEN
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

    return MediaWebSocketProtocol
