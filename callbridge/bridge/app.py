"""The HTTP surface of one bridge process: carrier webhooks and media websockets, health, readiness, metrics.

``/readyz`` answers 503 once the process is draining (shutdown has begun),
so a load balancer stops sending new calls before the listener closes, and
while it could take none (its registry unreachable, no engine endpoint in
service).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager, suppress
from typing import Final

from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Info,
    ProcessCollector,
    generate_latest,
)

from callbridge import __version__
from callbridge.application.hooks import ModuleApplication
from callbridge.bridge.app_events import event_delivery
from callbridge.bridge.call_config import assistant_source
from callbridge.bridge.carrier_plugin import load_carrier
from callbridge.bridge.console_fleet import announce_forever
from callbridge.bridge.console_http import console_on, console_router
from callbridge.bridge.console_journal import CallJournal
from callbridge.bridge.dialer import ApplicationCalls, Dialer
from callbridge.bridge.engine_admin import install_engine_pool, start_engine_pool
from callbridge.bridge.engine_factory import build_engine
from callbridge.bridge.fleet_port import FleetPort
from callbridge.bridge.group_metrics import PUBLISH_EVERY_S, GroupPublisher, group_metrics_dir
from callbridge.bridge.http_limits import BodyLimit
from callbridge.bridge.metrics import BridgeMetrics
from callbridge.bridge.outbound_api import outbound_router
from callbridge.bridge.recording_store import RecordingStore
from callbridge.bridge.registry import CallRegistry, RegistryUnavailable
from callbridge.bridge.registry_backend import build_registry
from callbridge.bridge.registry_host import HostAddress
from callbridge.bridge.replay import ReplayRelease
from callbridge.bridge.services import (
    BridgeServices,
    CarrierRest,
    HangUpFn,
)
from callbridge.bridge.stream_token import AppMintedTokens
from callbridge.carriers import CARRIERS
from callbridge.compiled import COMPILED_MODULES, compiled_modules, stale_modules
from callbridge.config import Settings
from callbridge.engine.port import DuplexEngine
from callbridge.logging import get_logger
from callbridge.stall import PROCESS_STALL_MS

__all__ = ["BridgeState", "create_app"]

log = get_logger(__name__)

_STARTED_HOOK_S: Final = 5.0
"""How long a Python application's ``started`` hook may take before the bridge serves on without it."""


class BridgeState:
    """Process-wide state the HTTP handlers read: the services, readiness and the metrics registry."""

    def __init__(
        self, settings: Settings, engine: DuplexEngine, hang_up: HangUpFn | None, registry_host: HostAddress | None = None
    ) -> None:
        self.settings = settings
        self.registry = CollectorRegistry()
        self.process_metrics = ProcessCollector(registry=self.registry)
        self.build_info = Info("callbridge_build", "callbridge version; compiled: its per-frame modules are (CALLBRIDGE_COMPILE=1)", registry=self.registry)
        self.build_info.info({"version": __version__, "compiled": "true" if compiled_modules() else "false"})
        self.group: GroupPublisher | None = None
        """A ``--workers`` worker's: ``/metrics`` answers for the whole process group (``group_metrics``)."""
        self.carriers = tuple(load_carrier(spec) for spec in CARRIERS)
        rests: dict[str, CarrierRest] = {c.name: c.rest(settings) for c in self.carriers if c.rest is not None}
        registry, tokens = build_registry(settings, registry_host)
        if settings.server.stream_token_secret is not None:  # and those the application mints (``stream_token``)
            tokens = AppMintedTokens(tokens, settings.server.stream_token_secret, registry)
        self.services = BridgeServices(
            settings=settings,
            engine=engine,
            registry=registry,
            tokens=tokens,
            metrics=BridgeMetrics(
                self.registry, memory_registry=registry.entry_count is not None, local_engine=engine.session_count is not None,
                group_registry=registry.levels_fetched,
            ),
            hang_up=hang_up or self._hang_up,
            carrier_rests=rests,
            carrier_capabilities={spec.name: spec.capabilities for spec in CARRIERS},
            assistants=assistant_source(settings),
        )
        application = self.services.assistants.application if self.services.assistants is not None else None
        self.services.events = events = event_delivery(application, self.services.metrics, observed=console_on(settings.console))
        if events is not None and console_on(settings.console):  # always built then: the journal observes them
            self.services.journal = CallJournal(registry, settings.console, self.services.metrics, self.services.process_id)
            events.observers.append(self.services.journal.observe)
        recording = settings.recording
        self.services.recordings = RecordingStore(
            recording.directory, self.services.metrics,
            max_pending_bytes=recording.max_pending_mb * 1024 * 1024, upload_timeout_s=recording.upload_timeout_s,
        )  # fmt: skip
        for name, rest in rests.items():
            if callable(getattr(rest, "perform", None)):  # the carrier's REST API transfers calls / sends DTMF
                self.services.action_performers[name] = rest  # type: ignore[assignment]
        dialers = {name: rest for name, rest in rests.items() if callable(getattr(rest, "dial", None))}  # it places calls
        self.services.dialer = Dialer(self.services, dialers)  # type: ignore[arg-type]

    @property
    def fleet(self) -> FleetPort:
        """The process among its fleet, as the app drives it: readiness, the drain, other processes' signals."""
        return self.services

    @property
    def draining(self) -> bool:
        return self.fleet.draining

    @draining.setter
    def draining(self, value: bool) -> None:
        self.fleet.draining = value

    async def drain(self) -> None:
        """SIGTERM's first step (``callbridge serve``), before the listener closes: ``FleetPort.drain`` with
        ``server.drain_timeout_s``."""
        await self.fleet.drain(self.settings.server.drain_timeout_s)

    async def _hang_up(self, provider: str, call_id: str, account_id: str | None, reason: str) -> None:
        rest = self.services.carrier_rests.get(provider)
        if rest is None:
            raise LookupError(f"{provider} has no REST hang-up")
        await rest.hang_up(call_id, account_id)


async def _sample_load(services: BridgeServices, every_s: float = 0.5) -> None:
    """How late the loop wakes a sleeper (a stalled loop delays every call's frames by as much), and the
    process's CPU use (admission's budget). A wake-up ``PROCESS_STALL_MS`` late or more is logged: this process
    did not run meanwhile (stopped, its VM frozen, a call that blocked the loop), and every caller heard that much
    silence."""
    loop = asyncio.get_running_loop()
    metrics, cpu = services.metrics, services.cpu
    cpu.sample(time.monotonic(), time.process_time())
    while True:
        due = loop.time() + every_s
        await asyncio.sleep(every_s)
        late_s = max(0.0, loop.time() - due)
        metrics.event_loop_lag_seconds.observe(late_s)
        if late_s >= PROCESS_STALL_MS / 1000:
            log.warning("event_loop_stalled", late_s=round(late_s, 3), calls=len(services.admission.bridged))
        cpu.sample(time.monotonic(), time.process_time(), len(services.admission.bridged))
        metrics.cpu_utilization.set(cpu.utilization)


async def _fetch_registry_levels(registry: CallRegistry, every_s: float = PUBLISH_EVERY_S) -> None:
    """The group registry's counts for the level gauges (``CallRegistry.levels_fetched``), fetched as often as a
    worker publishes its levels; a host that does not answer leaves the last counts until it does."""
    while True:
        with suppress(RegistryUnavailable):
            await registry.refresh_levels()
        await asyncio.sleep(every_s)


async def _application_started(services: BridgeServices, settings: Settings) -> None:
    """A Python application's ``started(calls)`` hook, where it has one: what places calls (``ApplicationCalls``).
    One that fails or takes more than ``_STARTED_HOOK_S`` is logged; the bridge serves on."""
    application = services.assistants.application if services.assistants is not None else None
    if not isinstance(application, ModuleApplication) or services.dialer is None:
        return
    base = settings.server.public_url or f"http://{settings.server.host}:{settings.server.port}"
    try:
        await asyncio.wait_for(application.started(ApplicationCalls(services.dialer, base.rstrip("/"))), _STARTED_HOOK_S)
    except Exception as exc:  # noqa: BLE001 - the application's own bug (or a slow hook): logged, the bridge serves on
        log.warning("application_started_failed", error=repr(exc))


async def _close_services(services: BridgeServices) -> None:
    """At shutdown, once the listeners are closed: the background tasks, the engine, the registry, the carriers'
    REST clients, the application's event delivery and the console's journal, the recordings' store and the application's client."""
    await services.aclose_background()
    await services.engine.aclose()
    if services.events is not None:
        await services.events.aclose()
    if services.journal is not None:  # the calls just ended, into the registry before it closes
        await services.journal.aclose()
    await services.registry.aclose()
    for rest in services.carrier_rests.values():
        await rest.aclose()
    if services.recordings is not None:
        await services.recordings.aclose()
    if services.assistants is not None:
        await services.assistants.aclose()


def create_app(
    settings: Settings, engine: DuplexEngine | None = None, hang_up: HangUpFn | None = None, *, registry_host: HostAddress | None = None
) -> FastAPI:
    """Build the ASGI app for ``settings`` (the engine ``engine.kind`` names unless given); its state lives in
    ``app.state.bridge``. ``registry_host``: a ``serve --workers`` worker's group registry (``registry_host``)."""
    state = BridgeState(settings, engine or build_engine(settings), hang_up, registry_host)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as listeners:
            for carrier in state.carriers:
                if carrier.listener is not None:
                    await listeners.enter_async_context(carrier.listener(state.services))
            await state.services.engine.warm_up()  # before the first call, not on its audio's time
            if state.services.dialer is not None:  # a dial's first credentials before the pacer times it
                await state.services.dialer.prepare()
            await _application_started(state.services, settings)
            log.info(
                "bridge_started", host=settings.server.host, port=settings.server.port, engine=settings.engine.kind, version=__version__,
                compiled=f"{len(compiled_modules())}/{len(COMPILED_MODULES)}",
            )  # fmt: skip
            stale = stale_modules()
            if stale:
                log.warning("compiled_modules_stale", modules=stale, detail="edited since the build: the built code runs; rebuild them")
            state.services.spawn(_sample_load(state.services))
            start_engine_pool(state.services.engine)  # its health probes begin before the first call
            state.fleet.start_listening()  # other processes' word on calls whose stream is here
            state.services.metrics.watch(state.services, asyncio.get_running_loop())
            if state.group is not None:
                state.services.spawn(state.group.run())  # the other workers' scrapes see this one's levels
            if state.services.registry.levels_fetched:
                state.services.spawn(_fetch_registry_levels(state.services.registry))
            if console_on(settings.console):  # the console's fleet view: this process among the others
                state.services.spawn(announce_forever(state.services))
            try:
                yield
            finally:
                state.draining = True
                log.info("bridge_stopping", active_calls=len(state.fleet.active_calls))
        await _close_services(state.services)

    app = FastAPI(title="callbridge", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.add_middleware(ReplayRelease, guard=state.services.replays)  # a failed answer's signature may come again
    app.add_middleware(BodyLimit)  # before any route reads a body it has not yet authenticated
    app.state.bridge = state
    for carrier in state.carriers:
        if carrier.router is not None:
            app.include_router(carrier.router(state.services))
    assert state.services.dialer is not None
    app.include_router(outbound_router(settings, state.services.dialer))
    app.include_router(console_router(state.services))
    pool_metrics = install_engine_pool(app, state.registry, state.services.engine, settings)  # metrics, /admin/engines
    group_dir = group_metrics_dir()
    if group_dir is not None:
        scrape_time = [state.process_metrics, *([pool_metrics] if pool_metrics is not None else [])]
        state.group = GroupPublisher(group_dir, state.services.metrics.levels, scrape_time, static=[state.build_info])

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process serves HTTP."""
        return {"status": "ok", "version": __version__}

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        """Readiness: 200 while new calls can be taken; 503 with the reason (``draining``,
        ``registry_unavailable``, ``no_engine``) while not."""
        fleet = state.fleet
        reason = await fleet.unready_because()
        fleet.readiness_answered(reason)
        if reason is not None:
            return JSONResponse({"status": reason}, status_code=503)
        return JSONResponse({"status": "ready", "active_calls": len(fleet.active_calls)})

    @app.get("/metrics")
    async def metrics() -> Response:
        """This process's metrics; a ``--workers`` worker's: the whole group's, whichever worker answers."""
        body = state.group.scrape() if state.group is not None else generate_latest(state.registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app
