"""The engine pool's operator surface: ``/admin/engines`` (list, drain, undrain) and its Prometheus metrics.

The routes exist only where ``server.admin_token`` is set (otherwise 404, as
for any unknown path) and the engine is a pool (``engine.kind = "realtime"``);
each request needs ``Authorization: Bearer <admin_token>`` (401 without).
Drain state belongs to the bridge process that was asked: with several
processes (``serve --workers N``, a fleet), ask each one.

    GET  /admin/engines                       every endpoint: state, sessions here, failures, ejections
    POST /admin/engines/drain   {"url": …}    no new call goes there; running calls finish (and may resume)
    POST /admin/engines/undrain {"url": …}    it takes new calls again
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, HTTPException
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from pydantic import BaseModel

from callbridge.config import Settings
from callbridge.engine.endpoints import EndpointStatus
from callbridge.engine.pool import EnginePool
from callbridge.engine.port import DuplexEngine
from callbridge.logging import get_logger

__all__ = ["EndpointRequest", "EnginePoolCollector", "engine_admin_router", "install_engine_pool", "start_engine_pool"]

log = get_logger(__name__)

_STATES = ("healthy", "ejected", "draining")


def install_engine_pool(
    app: FastAPI, metrics: CollectorRegistry, engine: DuplexEngine, settings: Settings
) -> EnginePoolCollector | None:
    """Where ``engine`` is a pool: its metrics into ``metrics`` (the collector returned), and the admin routes
    when a token is set."""
    if not isinstance(engine, EnginePool):
        return None
    collector = EnginePoolCollector(engine)
    metrics.register(collector)
    if settings.server.admin_token is not None:
        app.include_router(engine_admin_router(engine, settings.server.admin_token.get_secret_value()))
    return collector


def start_engine_pool(engine: DuplexEngine) -> None:
    """At startup, in the event loop: where ``engine`` is a pool, its health probes begin now rather than with
    the first call."""
    if isinstance(engine, EnginePool):
        engine.start()


class EndpointRequest(BaseModel):
    url: str
    """The endpoint as configured in ``engine.urls`` (or its full duplex URL, as a resume ticket names it)."""


def _as_json(status: EndpointStatus) -> dict[str, Any]:
    return {
        "url": status.url,
        "state": status.state,
        "health": status.health.value,
        "draining": status.draining,
        "sessions": status.sessions,
        "server_sessions": status.server_sessions,
        "failures_in_a_row": status.failures_in_a_row,
        "ejections": status.ejections,
    }


def engine_admin_router(pool: EnginePool, token: str) -> APIRouter:
    """``/admin/engines`` over ``pool``, each request checked against the bearer ``token``."""
    expected = f"Bearer {token}".encode()

    def authorized(authorization: Annotated[str | None, Header()] = None) -> None:
        if authorization is None or not hmac.compare_digest(authorization.encode(), expected):
            raise HTTPException(401, "admin token required", headers={"WWW-Authenticate": "Bearer"})

    router = APIRouter(prefix="/admin/engines", dependencies=[Depends(authorized)])

    @router.get("")
    async def list_endpoints() -> dict[str, list[dict[str, Any]]]:
        return {"endpoints": [_as_json(status) for status in pool.status()]}

    def _apply(action: Callable[[str], EndpointStatus], name: str, url: str) -> dict[str, Any]:
        try:
            status = action(url)
        except KeyError:
            raise HTTPException(404, f"no engine endpoint {url}") from None
        log.info(f"admin_engine_{name}", endpoint=status.url)
        return _as_json(status)

    @router.post("/drain")
    async def drain(request: EndpointRequest) -> dict[str, Any]:
        return _apply(pool.drain, "drain", request.url)

    @router.post("/undrain")
    async def undrain(request: EndpointRequest) -> dict[str, Any]:
        return _apply(pool.undrain, "undrain", request.url)

    return router


class EnginePoolCollector(Collector):
    """The pool's gauges and counters, read from its core when ``/metrics`` is scraped (nothing per call)."""

    def __init__(self, pool: EnginePool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        sessions = GaugeMetricFamily(
            "callbridge_engine_endpoint_sessions",
            "Engine sessions this process holds, by endpoint",
            labels=["endpoint"],
        )
        state = GaugeMetricFamily(
            "callbridge_engine_endpoint_state",
            "1 for the endpoint's state: healthy, ejected (failing; probed back in), or draining (the operator's)",
            labels=["endpoint", "state"],
        )
        ejections = CounterMetricFamily(
            "callbridge_engine_endpoint_ejections", "Times an endpoint was taken out for failing", labels=["endpoint"]
        )
        for status in self.pool.status():
            sessions.add_metric([status.url], status.sessions)
            for name in _STATES:
                state.add_metric([status.url, name], 1.0 if status.state == name else 0.0)
            ejections.add_metric([status.url], status.ejections)
        failovers = CounterMetricFamily(
            "callbridge_engine_failovers",
            "Session opens an endpoint refused or failed, so the next one was tried, by reason (the engine's code)",
            labels=["endpoint", "reason"],
        )
        for (url, reason), count in sorted(self.pool.endpoints.failovers.items()):
            failovers.add_metric([url, reason], count)
        yield from (sessions, state, ejections, failovers)
