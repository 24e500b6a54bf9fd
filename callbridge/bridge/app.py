"""The HTTP surface of one bridge process: health, readiness, metrics.

Carrier webhooks and media websockets mount here as the providers land.
``/readyz`` answers 503 once the process is draining (shutdown has begun), so
a load balancer stops sending new calls before the listener closes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Info, generate_latest
from prometheus_client import ProcessCollector

from callbridge import __version__
from callbridge.config import Settings
from callbridge.logging import get_logger

__all__ = ["BridgeState", "create_app"]

log = get_logger(__name__)


class BridgeState:
    """Process-wide state the HTTP handlers read: readiness and the metrics registry."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.draining = False
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        Info("callbridge_build", "callbridge version", registry=self.registry).info({"version": __version__})


def create_app(settings: Settings) -> FastAPI:
    """Build the ASGI app for ``settings``; its state lives in ``app.state.bridge``."""
    state = BridgeState(settings)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        log.info("bridge_started", host=settings.server.host, port=settings.server.port, version=__version__)
        try:
            yield
        finally:
            state.draining = True
            log.info("bridge_stopping")

    app = FastAPI(title="callbridge", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.bridge = state

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process serves HTTP."""
        return {"status": "ok", "version": __version__}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Readiness: 200 while new calls are admitted, 503 once draining."""
        if state.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)

    return app
