"""A server process: uvicorn on sockets bound beforehand, its first SIGTERM draining the bridge while the listener
still serves. ``callbridge serve`` and each ``--workers`` worker run ``serve_bridge``; ``engine-server`` runs
``run_uvicorn`` on the engine's app."""

from __future__ import annotations

import signal
from collections.abc import Awaitable, Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, Final

from callbridge.config import Settings

if TYPE_CHECKING:
    from callbridge.bridge.registry_host import HostAddress

__all__ = ["EXIT_FAILED", "EXIT_OK", "run_uvicorn", "serve_bridge"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1


def serve_bridge(settings: Settings, sockets: list[Any], registry_host: HostAddress | None = None) -> int:
    """One bridge process on ``sockets`` (bound to ``server.host``:``server.port``) until SIGTERM (drained) or
    SIGINT. ``registry_host``: a ``serve --workers`` worker's group registry, held by the supervisor."""
    from callbridge.bridge.app import create_app
    from callbridge.logging import configure_logging

    configure_logging(settings.log)  # before the app's first lines (``carrier_not_configured``): in their format and level
    app = create_app(settings, registry_host=registry_host)
    return run_uvicorn(
        settings, app, settings.server.host, settings.server.port, drain=app.state.bridge.drain, sockets=sockets
    )


def run_uvicorn(
    settings: Settings,
    app: Any,
    host: str,
    port: int,
    *,
    drain: Callable[[], Awaitable[None]] | None = None,
    sockets: list[Any] | None = None,
    bridge: bool = True,
) -> int:
    """Serve ``app`` until SIGTERM/SIGINT. With ``drain``: the first signal runs it while the listener still
    serves (``/readyz`` answers 503, calls move away), then uvicorn's graceful shutdown; a second one stops
    at once. ``bridge``: False for an engine server (``serving_options``)."""
    import uvicorn

    from callbridge.bridge.http_protocol import serving_options
    from callbridge.logging import configure_logging

    configure_logging(settings.log)
    server = _draining_server(uvicorn, drain)(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            **serving_options(bridge=bridge),
            lifespan="on",
        )
    )
    # uvicorn shuts down gracefully on SIGTERM/SIGINT, then re-raises the signal
    # to the handler that was installed before it ran. A no-op handler there
    # makes a graceful stop exit 0 instead of dying by the signal.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _after_graceful_shutdown)
    server.run(sockets=sockets)
    # not started: its startup failed (the lifespan refused), or it was told to stop before it finished starting
    return EXIT_OK if server.started or server.stopped_while_starting else EXIT_FAILED


def _after_graceful_shutdown(signum: int, frame: FrameType | None) -> None:
    """The signal was handled by uvicorn's graceful shutdown; nothing is left to do."""


def _draining_server(uvicorn: Any, drain: Callable[[], Awaitable[None]] | None) -> Callable[[Any], Any]:
    """A ``uvicorn.Server`` whose first SIGTERM/SIGINT runs ``drain`` (where given) on the event loop before the
    usual shutdown (which stops listening at once, too early for a load balancer to read ``/readyz``), and which
    remembers a signal that came before its startup finished (``stopped_while_starting``: told to stop, not
    failed)."""
    import asyncio
    import concurrent.futures

    class DrainingServer(uvicorn.Server):  # type: ignore[misc]
        _loop: asyncio.AbstractEventLoop | None = None
        _draining: concurrent.futures.Future[None] | None = None
        stopped_while_starting = False

        async def serve(self, sockets: Any = None) -> None:
            self._loop = asyncio.get_running_loop()
            await super().serve(sockets)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.started:
                self.stopped_while_starting = True
            if drain is None or self._draining is not None or self._loop is None or not self.started:
                super().handle_exit(sig, frame)  # no drain, a second signal, or before startup: stop now
                return
            self._draining = asyncio.run_coroutine_threadsafe(self._drain_then_exit(drain), self._loop)

        async def _drain_then_exit(self, run_drain: Callable[[], Awaitable[None]]) -> None:
            try:
                await run_drain()
            finally:
                self.should_exit = True

    return DrainingServer
