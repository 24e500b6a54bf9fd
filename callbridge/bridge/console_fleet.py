"""The fleet as the console shows it: each bridge process announces itself in the registry every
``ANNOUNCE_EVERY_S`` (``CallRegistry.announce``) — its host, its calls against its limit, whether it takes new ones
(``/readyz``'s reason where not: draining, its registry, no engine), its engine's endpoints with their state and
sessions — and the announcement lapses ``KEPT_MS`` after, so a process that died leaves the list within seconds.
Only where the console is on."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any, Final

import orjson

from callbridge import __version__
from callbridge.bridge.recording_store import public_url
from callbridge.bridge.registry import RegistryUnavailable
from callbridge.bridge.services import BridgeServices
from callbridge.engine.pool import EnginePool
from callbridge.logging import get_logger

__all__ = ["ANNOUNCE_EVERY_S", "KEPT_MS", "announce_forever", "bridge_status"]

log = get_logger(__name__)

ANNOUNCE_EVERY_S: Final = 5.0
KEPT_MS: Final = 15_000
"""An announcement lapses after this: three missed in a row."""


def bridge_status(services: BridgeServices, started_at: float, unready: str | None) -> dict[str, Any]:
    """How this process stands now (JSON-ready)."""
    engine, server = services.engine, services.settings.server
    if isinstance(engine, EnginePool):
        endpoints = [
            {"url": public_url(s.url), "state": s.state, "sessions": s.sessions, "server_sessions": s.server_sessions, "ejections": s.ejections}
            for s in engine.status()
        ]  # fmt: skip
        engine_view: dict[str, Any] = {"kind": "pool", "endpoints": endpoints}
    else:
        engine_view = {"kind": "embedded", "sessions": engine.session_count}
    return {
        "process_id": services.process_id, "host": socket.gethostname(), "pid": os.getpid(), "version": __version__,
        "started_at": started_at, "at": time.time(), "calls": len(services.active_calls), "max_calls": server.max_calls,
        "max_calls_fleet": server.max_calls_fleet, "ready": unready is None, "unready_because": unready,
        "draining": services.draining, "engine": engine_view,
    }  # fmt: skip


async def announce_forever(services: BridgeServices) -> None:
    """Announce this process every ``ANNOUNCE_EVERY_S`` until cancelled; a registry that fails one is tried again at
    the next."""
    started_at = time.time()
    while True:
        try:
            status = bridge_status(services, started_at, await services.unready_because())
            await services.registry.announce(services.process_id, orjson.dumps(status).decode(), KEPT_MS)
        except RegistryUnavailable as exc:
            log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
        await asyncio.sleep(ANNOUNCE_EVERY_S)
