"""A real ``engine-server`` (uvicorn, loopback) inside the test's event loop, and a raw wire client."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import orjson
import uvicorn
from websockets.asyncio.client import ClientConnection, connect

from callbridge.config import Settings
from callbridge.engine.local.core import LocalEngineOptions
from callbridge.engine.local.engine import LocalEngine
from callbridge.engine.server import EngineServer, create_engine_app
from tests.conftest import free_port


@dataclass
class RunningEngineServer:
    url: str
    engine: LocalEngine
    server: EngineServer


@asynccontextmanager
async def engine_server(
    options: LocalEngineOptions | None = None, *, port: int | None = None, **server_settings: Any
) -> AsyncIterator[RunningEngineServer]:
    """``port``: listen there (a server coming back on its old address); default a free one."""
    port = port or free_port()
    settings = Settings.model_validate({"engine_server": {"port": port, **server_settings}})
    engine = LocalEngine(options or LocalEngineOptions(generation_speed=20.0, chunk_ms=500))
    app = create_engine_app(settings, engine)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, ws="websockets-sansio", lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield RunningEngineServer(f"ws://127.0.0.1:{port}", engine, app.state.engine_server)
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


class RawClient:
    """A bare websocket speaking JSON frames, for checking the server's answers frame by frame."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.updated: dict[str, Any] | None = None

    @classmethod
    async def connect(cls, url: str, path: str = "/v1/realtime?duplex=1&autostart=0") -> RawClient:
        return cls(await connect(url + path, max_size=2**24))

    async def send(self, payload: dict[str, Any]) -> None:
        await self.ws.send(orjson.dumps(payload).decode())

    async def recv(self, timeout_s: float = 5.0) -> dict[str, Any]:
        payload: dict[str, Any] = orjson.loads(await asyncio.wait_for(self.ws.recv(), timeout_s))
        return payload

    async def recv_until(self, event_type: str, timeout_s: float = 5.0) -> list[dict[str, Any]]:
        events = []
        while True:
            event = await self.recv(timeout_s)
            events.append(event)
            if event["type"] == event_type:
                return events

    async def append(self, pcm: bytes) -> None:
        await self.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})

    async def open(self, session: dict[str, Any] | None = None) -> dict[str, Any]:
        """``session.created`` (or the error); the ``session.updated`` that follows it is read too, into ``updated``."""
        await self.send({"type": "session.update", "session": session or {"input_audio_format": "pcm16", "sample_rate_hz": 16000}})
        created = await self.recv()
        if created["type"] == "session.created":
            self.updated = await self.recv()
        return created
