"""Asterisk AudioSocket's side of the bridge: a TCP listener Asterisk connects to (telephony-protocols.md §4.1, §7).

Dialplan: ``Answer()``, then ``AudioSocket(<uuid>,bridge-host:9092)``. There
is no webhook, no token and no REST API: a connection is admitted by its source
address (``audiosocket.allowed_sources``), must send its uuid frame within
``audiosocket.first_frame_timeout_s`` and its first audio frame within as long
again, and is then served by the shared ``MediaStreamDriver``.

The uuid is the call id. When the socket drops, ``AudioSocket()`` returns and
the dialplan may loop back to it with the same uuid: the new connection
resumes the call's engine session through the registry. A new connection for a
uuid whose previous connection is still being served supersedes it: the old
one is closed (its engine session detached) before the new one binds, so a
quick dialplan loop never races the detach, and a half-open old socket does not
block the call. The bridge hangs up in band (``00 00 00``); Asterisk treats that
exactly like a close, so the dialplan continues either way (see
docs/carriers/audiosocket.md for a loop that stops).
"""

from __future__ import annotations

import asyncio
import ipaddress
import itertools
import socket
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from types import TracebackType
from typing import Final, Self

from callbridge.bridge.carrier_plugin import Carrier
from callbridge.bridge.carrier_services import CarrierServices
from callbridge.bridge.carrier_transport import receive_within
from callbridge.bridge.media import MediaStreamDriver
from callbridge.carriers.audiosocket.wire import (
    PROVIDER,
    AudioSocketCodec,
    first_frame_bytes,
    peek_call_id,
)
from callbridge.logging import get_logger
from callbridge.sources import Network, source_allowed

__all__ = ["CARRIER", "AudioSocketListener", "StreamTransport", "source_allowed"]

log = get_logger(__name__)

_READ_BYTES: Final = 64 * 1024
_WRITE_TIMEOUT_S: Final = 5.0
_LINGER_S: Final = 2.0
"""After the FIN, how long the peer has to read what we sent and close its side before the socket is closed."""
"""A peer that has not taken our writes for this long is gone (we send a few frames' worth at a time)."""
_SUPERSEDE_WAIT_S: Final = 3.0
"""How long a reconnecting call waits for its previous connection to let go of the engine session."""
_SHUTDOWN_WAIT_S: Final = 5.0


class StreamTransport:
    """An accepted AudioSocket connection as a ``CarrierTransport``: chunks of the byte stream in, frames out.

    ``receive`` first returns what the listener already read (the uuid frame), then chunks as they come;
    None at EOF, on a reset, when the first audio frame is late, or after ``idle_timeout_s`` of silence
    (``timed_out`` says which). ``close`` ignores the websocket close code.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        codec: AudioSocketCodec,
        *,
        prefix: bytes = b"",
        first_audio_timeout_s: float,
        idle_timeout_s: float,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._codec = codec
        self._prefix = prefix
        self._first_audio_by = asyncio.get_running_loop().time() + first_audio_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self.closed = False
        self.timed_out: str | None = None

    async def receive(self) -> bytes | None:
        if self._prefix:
            data, self._prefix = self._prefix, b""
            return data
        if self.closed:
            return None
        timeout = self._idle_timeout_s
        if not self._codec.started:
            timeout = min(timeout, max(0.0, self._first_audio_by - asyncio.get_running_loop().time()))
        try:
            data = await receive_within(self._read, timeout)
        except TimeoutError:
            self.timed_out = "idle" if self._codec.started else "no_audio"
            return None
        except OSError:  # reset by the peer
            return None
        return data or None

    async def _read(self) -> bytes:
        return await self._reader.read(_READ_BYTES)

    async def send(self, message: str | bytes) -> None:
        if self.closed:
            raise ConnectionError("AudioSocket connection closed")
        if isinstance(message, str):
            raise TypeError("AudioSocket carries bytes only")
        self._writer.write(message)  # one write per frame: Asterisk wants header and payload together
        async with asyncio.timeout(_WRITE_TIMEOUT_S):
            await self._writer.drain()

    async def close(self, code: int = 1000) -> None:
        if self.closed:
            return
        self.closed = True
        if self._writer.can_write_eof():
            with suppress(OSError, RuntimeError):
                # FIN right after what was sent (the hang-up frame): Asterisk reads it, then closes its side.
                # Closing at once, with the caller's audio still unread here, would reset the connection
                # instead, and a reset can take the hang-up frame with it.
                self._writer.write_eof()
                if isinstance(transport := self._writer.transport, asyncio.ReadTransport):
                    transport.pause_reading()  # what the peer still sends is not ours to read
                self._reader.feed_eof()  # a receive waiting for data returns now: the stream is over
                asyncio.get_running_loop().call_later(_LINGER_S, self._writer.close)
                return
        self._writer.close()
        with suppress(Exception):
            async with asyncio.timeout(1.0):
                await self._writer.wait_closed()


@dataclass(slots=True)
class _Connection:
    call_id: str
    transport: StreamTransport
    task: asyncio.Task[None]


class AudioSocketListener(AbstractAsyncContextManager["AudioSocketListener"]):
    """The AudioSocket TCP server for the life of the app (nothing when ``audiosocket.enabled`` is off)."""

    def __init__(self, services: CarrierServices) -> None:
        self.services = services
        self.settings = services.settings.audiosocket
        self.networks: list[Network] = [ipaddress.ip_network(s, strict=False) for s in self.settings.allowed_sources]
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._live: dict[str, _Connection] = {}
        self._numbers = itertools.count(1)

    @property
    def port(self) -> int | None:
        """The port the listener is bound to (None when it is not running)."""
        if self._server is None or not self._server.sockets:
            return None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> Self:
        if not self.settings.enabled:
            log.info("carrier_not_configured", provider=PROVIDER, detail="audiosocket.enabled is false: no AudioSocket listener")
            return self
        self._server = await asyncio.start_server(self._accept, self.settings.host, self.settings.port)
        log.info("audiosocket_listening", host=self.settings.host, port=self.port, allowed_sources=self.settings.allowed_sources)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._server is None:
            return
        self._server.close()
        await self._server.wait_closed()
        self._server = None
        # each live call's socket closes: its driver detaches the engine session (resumable on another bridge)
        for connection in list(self._live.values()):
            await connection.transport.close()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=_SHUTDOWN_WAIT_S)
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with suppress(asyncio.CancelledError, Exception):
                await task
        log.info("audiosocket_stopped")

    # ------------------------------------------------------------ connections

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if not source_allowed(host, self.networks):
                self._refuse("source_not_allowed", peer=host)
                return
            if (early := self.services.desk.refusal_before_call_id()) is not None:
                self._refuse(early, peer=host)
                return
            try:
                first = await self._first_frame(reader)
            except TimeoutError:
                self._refuse("first_frame_timeout", peer=host)
                return
            except OSError:
                return
            if not first:
                log.info("audiosocket_closed_before_uuid", provider=PROVIDER, peer=host)
                return
            call_id = peek_call_id(first)  # None: not a uuid frame; the codec says what is wrong
            if call_id is not None:
                if (refusal := await self.services.desk.stream_refusal(call_id)) is not None:
                    self._refuse(refusal, peer=host, call_id=call_id)
                    return
                await self._supersede(call_id)
            await self._run(reader, writer, first, call_id)
        finally:
            writer.close()
            with suppress(Exception):
                async with asyncio.timeout(1.0):
                    await writer.wait_closed()

    async def _first_frame(self, reader: asyncio.StreamReader) -> bytes:
        """The bytes up to the end of the uuid frame (or up to whatever shows the first frame is not one)."""
        data = b""
        async with asyncio.timeout(self.settings.first_frame_timeout_s):
            while True:
                need = first_frame_bytes(data)
                if need is not None and len(data) >= need:
                    return data
                chunk = await reader.read(_READ_BYTES)
                if not chunk:
                    return data
                data += chunk

    async def _supersede(self, call_id: str) -> None:
        previous = self._live.get(call_id)
        if previous is None or previous.task.done():
            return
        log.info("audiosocket_call_superseded", provider=PROVIDER, call_id=call_id)
        await previous.transport.close()
        await asyncio.wait({previous.task}, timeout=_SUPERSEDE_WAIT_S)

    async def _run(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, first: bytes, call_id: str | None) -> None:
        codec = AudioSocketCodec(next(self._numbers))
        transport = StreamTransport(
            reader,
            writer,
            codec,
            prefix=first,
            first_audio_timeout_s=self.settings.first_frame_timeout_s,
            idle_timeout_s=self.settings.idle_timeout_s,
        )
        task = asyncio.current_task()
        assert task is not None
        connection = _Connection(call_id or "", transport, task)
        if call_id is not None:
            self._live[call_id] = connection
        try:
            await MediaStreamDriver(transport, codec, self.services, check_token=False).run()
        finally:
            if call_id is not None and self._live.get(call_id) is connection:
                del self._live[call_id]
            await transport.close()
        if transport.timed_out is not None:
            log.warning("audiosocket_timeout", provider=PROVIDER, call_id=call_id, waited_for=transport.timed_out)
            if transport.timed_out == "no_audio":
                self.services.metrics.stream_refused.labels(PROVIDER, "first_audio_timeout").inc()

    def _refuse(self, reason: str, **fields: str) -> None:
        self.services.metrics.stream_refused.labels(PROVIDER, reason).inc()
        log.warning("stream_refused", provider=PROVIDER, reason=reason, **fields)


CARRIER = Carrier(name=PROVIDER, listener=AudioSocketListener)
