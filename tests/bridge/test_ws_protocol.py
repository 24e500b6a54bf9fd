"""The media websockets' protocol (``callbridge.bridge.ws_protocol``): frames it writes itself are the frames
websockets would write, every payload length form reaches a real client intact, several messages the app writes
at once go in one write and arrive in order, and a client that sends faster than the app reads loses nothing
(reading pauses past a queue and resumes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode

from callbridge.bridge.ws_protocol import (
    DATA_FRAMES_EXTENSION,
    MESSAGE_LIMIT_EXTENSION,
    PRE_AUTH_MAX_MESSAGE_BYTES,
    frame_header,
    protocol_class,
)
from callbridge.sim.ports import free_port


@pytest.mark.parametrize("length", [0, 1, 125, 126, 127, 65535, 65536, 300_000])
@pytest.mark.parametrize("opcode", [Opcode.TEXT, Opcode.BINARY])
def test_a_header_is_the_one_websockets_writes(length: int, opcode: Opcode) -> None:
    payload = b"x" * length
    expected = Frame(opcode, payload).serialize(mask=False, extensions=[])
    first_byte = 0x81 if opcode is Opcode.TEXT else 0x82
    assert frame_header(first_byte, length) + payload == expected


def test_the_installed_uvicorn_gets_the_lighter_protocol() -> None:
    """If uvicorn's internals change, ``protocol_class`` falls back to uvicorn's own class: this says so."""
    chosen = protocol_class()
    assert not isinstance(chosen, str), "uvicorn's websockets-sansio protocol changed: the fast path is off"
    assert chosen.__name__ == "MediaWebSocketProtocol"


@contextlib.asynccontextmanager
async def _echo_server(
    read_delay_s: float = 0.0, *, limit: int | None = 1 << 20, received: list[object] | None = None
) -> AsyncIterator[str]:
    """A raw ASGI websocket app that echoes every message, on uvicorn with the protocol ``callbridge serve`` uses;
    ``limit``: the message limit it raises the connection to once accepted (None: left at the pre-auth one);
    ``received``: where it notes each message the app receives."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        if limit is not None:
            assert MESSAGE_LIMIT_EXTENSION in scope["extensions"]
            await send({"type": MESSAGE_LIMIT_EXTENSION, "max_bytes": limit})
        await asyncio.sleep(read_delay_s)
        while True:
            message = await receive()
            if received is not None:
                received.append(message.get("text") or message.get("code"))
            if message["type"] == "websocket.disconnect":
                return
            echo = {"type": "websocket.send"}
            echo.update({"text": message["text"]} if message.get("text") is not None else {"bytes": message["bytes"]})
            try:
                await send(echo)
            except Exception:  # the connection is closing (a message refused): read on to its disconnect
                continue

    async with _serving(app) as url:
        yield url


@contextlib.asynccontextmanager
async def _serving(app: Any) -> AsyncIterator[str]:
    """The raw ASGI ``app`` on uvicorn with the protocol ``callbridge serve`` uses; its websocket URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, ws=protocol_class(), lifespan="off", ws_max_size=1 << 20)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"ws://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        await task


async def test_every_length_form_round_trips_through_a_real_client() -> None:
    async with _echo_server() as url, connect(url, compression=None) as ws:
        for length in (0, 125, 126, 65535, 65536, 300_000):
            await ws.send("é" * (length // 2))
            assert await ws.recv() == "é" * (length // 2)
            await ws.send(bytes(range(256)) * (length // 256))
            assert await ws.recv() == bytes(range(256)) * (length // 256)


async def test_until_raised_a_message_over_the_pre_auth_limit_is_refused_1009_after_those_before_it() -> None:
    """Before the app raises the limit: a message at it is taken, one over it closes the connection 1009 (checked at
    its header, its payload never buffered), and what came before it in the same read reaches the app first."""
    from websockets.exceptions import ConnectionClosed

    received: list[object] = []
    async with _echo_server(limit=None, received=received) as url, connect(url, compression=None, max_size=None) as ws:
        await ws.send("a" * PRE_AUTH_MAX_MESSAGE_BYTES)
        assert await ws.recv() == "a" * PRE_AUTH_MAX_MESSAGE_BYTES
        await ws.send("before")
        await ws.send("b" * (PRE_AUTH_MAX_MESSAGE_BYTES + 1))
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), 5)
        for _ in range(100):
            if len(received) == 3:
                break
            await asyncio.sleep(0.01)
    assert ws.close_code == 1009 and received[1:] == ["before", 1009]


async def test_a_client_faster_than_the_app_loses_nothing() -> None:
    """200 messages land while the app sleeps: past 32 waiting, reading pauses; the app then takes them all, in
    order, and reading resumes."""
    async with _echo_server(read_delay_s=0.3) as url, connect(url, compression=None) as ws:
        sent = [f"message {i} " + "." * 300 for i in range(200)]
        for text in sent:
            await ws.send(text)
        received = [await asyncio.wait_for(ws.recv(), 5) for _ in sent]
    assert received == sent


async def test_a_text_frame_that_is_not_utf8_closes_with_1007() -> None:
    from websockets.exceptions import ConnectionClosed

    async with _echo_server() as url, connect(url, compression=None) as ws:
        await ws.send(b"\xff\xfe not utf-8", text=True)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 5)
        assert ws.close_code == 1007


class _CountedWrites:
    """A socket transport that counts ``write`` calls and passes everything through."""

    def __init__(self, transport: Any) -> None:
        self._transport = transport
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self._transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


async def _accept_counting_writes(scope: dict[str, Any], receive: Any, send: Any) -> tuple[Any, _CountedWrites]:
    """Accept the websocket; its ``DATA_FRAMES_EXTENSION`` writer, and the count of its socket's writes from now on."""
    await receive()
    await send({"type": "websocket.accept"})
    write = scope["extensions"][DATA_FRAMES_EXTENSION]["write"]
    counted = write.__self__.transport = _CountedWrites(write.__self__.transport)
    return write, counted


async def test_several_messages_the_app_writes_at_once_go_in_one_write_and_arrive_in_order() -> None:
    outcome: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        write, counted = await _accept_counting_writes(scope, receive, send)
        await receive()  # the client's go
        outcome["wrote"] = write(["media", b"\x00\x01\x02", "mark", "é" * 200])
        outcome["writes"] = counted.writes
        await receive()  # the client's close

    async with _serving(app) as url, connect(url, compression=None) as ws:
        await ws.send("go")
        received = [await asyncio.wait_for(ws.recv(), 5) for _ in range(4)]
    assert received == ["media", b"\x00\x01\x02", "mark", "é" * 200]  # text stays text, bytes binary
    assert outcome == {"wrote": True, "writes": 1}


async def test_once_the_app_has_closed_the_writer_writes_nothing_and_says_so() -> None:
    """Past the close (or on a full write buffer) what the app sends must go the ASGI way: ``write`` says False."""
    outcome: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        write, counted = await _accept_counting_writes(scope, receive, send)
        await send({"type": "websocket.close", "code": 1000})
        writes_by_close = counted.writes
        outcome["wrote"] = write(["late"])
        outcome["writes_after_close"] = counted.writes - writes_by_close

    async with _serving(app) as url, connect(url, compression=None) as ws:
        from websockets.exceptions import ConnectionClosedOK

        with pytest.raises(ConnectionClosedOK):
            await asyncio.wait_for(ws.recv(), 5)
    assert outcome == {"wrote": False, "writes_after_close": 0}
