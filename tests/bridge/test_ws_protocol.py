"""The media websockets' protocol (``callbridge.bridge.ws_protocol``): frames it writes itself are the frames
websockets would write, every payload length form reaches a real client intact, and a client that sends faster
than the app reads loses nothing (reading pauses past a queue and resumes)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from websockets.asyncio.client import connect
from websockets.frames import Frame, Opcode

from callbridge.bridge.ws_protocol import frame_header, protocol_class
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
async def _echo_server(read_delay_s: float = 0.0) -> AsyncIterator[str]:
    """A raw ASGI websocket app that echoes every message, on uvicorn with the protocol ``callbridge serve`` uses."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "websocket":
            return
        await receive()
        await send({"type": "websocket.accept"})
        await asyncio.sleep(read_delay_s)
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            echo = {"type": "websocket.send"}
            echo.update({"text": message["text"]} if message.get("text") is not None else {"bytes": message["bytes"]})
            await send(echo)

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
