"""Several vllm-omni servers as one engine: new sessions go to the least-loaded healthy one.

``EnginePool`` is a ``DuplexEngine`` over one ``RealtimeEngine`` per
endpoint; ``EndpointSet`` (``endpoints.py``) decides, this module does the
I/O:

- ``open()`` tries the candidates in order; ``resource_exhausted`` (the server
  is full) or a failed connect or handshake moves on to the next; when none
  takes the session it raises ``EngineError(resource_exhausted)`` and the
  bridge refuses the call cleanly. A session-config error (the same on every
  server) is raised at once.
- ``resume(ticket)`` goes to ``ticket.endpoint``, the server that holds the
  session, never another: its state lives there.
- A session counts toward its endpoint until it ends or is detached
  (``RealtimeSession.on_release``); the pool hands out its members' sessions as they are.
- Health: a background task GETs each endpoint's ``/health`` (vllm-omni and
  ``engine-server`` both serve it; it takes no session slot, where a
  websocket handshake would) every ``probe_interval_s``; ejected endpoints
  with backoff until one answers.
- A server that dies mid-call: each of its live sessions tries to resume
  within its reconnect budget (``RealtimeSession``, about 2 s) and then ends
  with ``connection_failed``, which the call hears as the failure tone and a
  hang-up. Sessions are not moved to another server — the conversation, the
  model's context and the resume journal live on the dead one — but the
  first refused reconnect (or open) ejects the endpoint, and so does the first
  session lost, so new calls go elsewhere before any probe fails.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable
from contextlib import suppress
from typing import Final
from urllib.parse import urlsplit, urlunsplit

import httpx

from callbridge.engine.endpoints import EndpointSet, EndpointStatus
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.events import EngineEvent, SessionClosed
from callbridge.engine.port import (
    DuplexEngine,
    DuplexSession,
    ResumeTicket,
    SessionConfig,
)
from callbridge.engine.realtime import RealtimeEngine, RealtimeSession, duplex_url
from callbridge.logging import get_logger
from callbridge.outbound_http import http_client

__all__ = ["EnginePool", "health_url"]

log = get_logger(__name__)

_SESSION_CONFIG_CODES: Final = frozenset(
    {ErrorCode.INVALID_SESSION_CONFIG, ErrorCode.UNSUPPORTED_AUDIO_FORMAT, ErrorCode.UNSUPPORTED_TURN_DETECTION}
)
"""Open errors about what we asked, not about the server: every server would answer the same."""


def health_url(url: str) -> str:
    """``ws://host:port[/prefix/v1/realtime]`` → ``http://host:port[/prefix]/health`` (``wss`` → ``https``)."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    for suffix in ("/v1/realtime", "/v1/duplex"):
        path = path.removesuffix(suffix)
    return urlunsplit((scheme, parts.netloc, path + "/health", "", ""))


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


class EnginePool(DuplexEngine):
    """vllm-omni servers (or ``callbridge engine-server``\\ s) behind one ``DuplexEngine``."""

    def __init__(
        self,
        urls: Iterable[str],
        *,
        api_key: str | None = None,
        reconnect_budget_s: float = 2.0,
        liveness_interval_s: float = 1.0,
        liveness_timeout_s: float = 1.0,
        handshake_timeout_s: float = 10.0,
        heartbeat_interval_s: float = 30.0,
        eject_after_failures: int = 3,
        probe_interval_s: float = 5.0,
        probe_backoff_max_s: float = 60.0,
        probe_timeout_s: float = 2.0,
    ) -> None:
        self.endpoints = EndpointSet(
            urls,
            eject_after_failures=eject_after_failures,
            probe_interval_ms=int(probe_interval_s * 1000),
            probe_backoff_max_ms=int(probe_backoff_max_s * 1000),
            now_ms=_now_ms(),
        )
        self.api_key = api_key
        self.probe_timeout_s = probe_timeout_s
        self._members = {
            url: RealtimeEngine(
                url,
                api_key=api_key,
                handshake_timeout_s=handshake_timeout_s,
                heartbeat_interval_s=heartbeat_interval_s,
                reconnect_budget_s=reconnect_budget_s,
                liveness_interval_s=liveness_interval_s,
                liveness_timeout_s=liveness_timeout_s,
            )
            for url in self.endpoints.urls
        }
        for url, member in self._members.items():
            member.on_unreachable = functools.partial(self._refused, url)
        self._by_wire_url = {engine.url: url for url, engine in self._members.items()}
        self._prober: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # ------------------------------------------------------------- the port

    async def open(self, config: SessionConfig) -> RealtimeSession:
        """A session on the best endpoint that takes it. Raises ``EngineError(resource_exhausted)`` when none
        does, or the session-config error every server would answer."""
        self._ensure_prober()
        tried: list[str] = []
        for url in self.endpoints.candidates(_now_ms()):
            self.endpoints.reserve(url)
            try:
                session = await self._members[url].open(config)
            except EngineError as exc:
                if exc.code in _SESSION_CONFIG_CODES:
                    self.endpoints.release(url)
                    raise
                ejections = self._ejections(url)
                outcome = self.endpoints.open_failed(url, exc.code, _now_ms())
                if exc.refused:  # nothing listens there: the server is down, not slow
                    self.endpoints.lost(url, _now_ms())
                log.warning(
                    "engine_endpoint_refused", endpoint=url, code=exc.code, detail=exc.message, outcome=outcome.value
                )
                tried.append(f"{url}: {exc.code}")
                self._log_ejection(url, ejections, "failures")
                continue
            except BaseException:  # cancelled while connecting
                self.endpoints.release(url)
                raise
            self._opened(url)
            return self._adopt(url, session)
        detail = "; ".join(tried) or "no endpoint in service (all draining)"
        raise EngineError(ErrorCode.RESOURCE_EXHAUSTED, f"no engine endpoint took the session ({detail})")

    async def resume(self, ticket: ResumeTicket) -> RealtimeSession:
        """Resume at the endpoint that holds the session (``ticket.endpoint``), draining or ejected alike. A
        ticket for a server no longer configured is resumed there all the same, uncounted."""
        self._ensure_prober()
        url = self._endpoint_of(ticket)
        if url is None:
            if ticket.endpoint is None:
                raise EngineError(
                    ErrorCode.INVALID_SESSION_RESUME,
                    "the ticket names no engine endpoint",
                    session_id=ticket.session_id,
                )
            log.info("engine_resume_outside_pool", endpoint=ticket.endpoint, session_id=ticket.session_id)
            return await next(iter(self._members.values())).resume(ticket)
        self.endpoints.reserve(url)
        try:
            session = await self._members[url].resume(ticket)
        except EngineError as exc:
            ejections = self._ejections(url)
            self.endpoints.resume_failed(url, exc.code, _now_ms())
            self._log_ejection(url, ejections, "failures")
            raise
        except BaseException:
            self.endpoints.release(url)
            raise
        self._opened(url)
        return self._adopt(url, session)

    async def aclose(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            with suppress(asyncio.CancelledError):
                await self._prober
            self._prober = None
        for member in self._members.values():
            await member.aclose()  # each session's close releases it

    # ------------------------------------------------------------ operators

    def status(self) -> list[EndpointStatus]:
        return self.endpoints.status()

    def find(self, url: str) -> str | None:
        """The configured endpoint ``url`` names (as configured, or as its duplex URL), or None."""
        if url in self.endpoints:
            return url
        return self._by_wire_url.get(duplex_url(url))

    def drain(self, url: str) -> EndpointStatus:
        """No new session goes to the endpoint; its sessions run on. Raises ``KeyError`` for an unknown url."""
        endpoint = self._known(url)
        self.endpoints.drain(endpoint)
        log.info("engine_endpoint_draining", endpoint=endpoint, sessions=self.endpoints.status(endpoint)[0].sessions)
        return self.endpoints.status(endpoint)[0]

    def undrain(self, url: str) -> EndpointStatus:
        endpoint = self._known(url)
        self.endpoints.undrain(endpoint)
        log.info("engine_endpoint_undrained", endpoint=endpoint)
        return self.endpoints.status(endpoint)[0]

    def where(self, session: DuplexSession) -> str | None:
        """The configured endpoint that holds ``session`` (None: not one of the pool's)."""
        endpoint = session.resume_ticket().endpoint
        return None if endpoint is None else self.find(endpoint)

    def _known(self, url: str) -> str:
        endpoint = self.find(url)
        if endpoint is None:
            raise KeyError(url)
        return endpoint

    # ------------------------------------------------------------- sessions

    def _endpoint_of(self, ticket: ResumeTicket) -> str | None:
        if ticket.endpoint is None:
            return self.endpoints.urls[0] if len(self.endpoints.urls) == 1 else None
        return self.find(ticket.endpoint)

    def _adopt(self, url: str, session: RealtimeSession) -> RealtimeSession:
        """Count ``session`` toward ``url`` until it ends or is detached."""
        session.on_release = lambda event: self._released(url, session.session_id, event)
        return session

    def _opened(self, url: str) -> None:
        if self.endpoints.opened(url):
            log.info("engine_endpoint_restored", endpoint=url, by="session")

    def _released(self, url: str, session_id: str, event: EngineEvent | None) -> None:
        """A session at ``url`` ended (``event``, its terminal event) or was detached (None). One lost past its
        resume window (``connection_failed``) ejects the endpoint: the server was unreachable all that time."""
        if isinstance(event, SessionClosed) and event.reason == ErrorCode.CONNECTION_FAILED:
            ejections = self._ejections(url)
            self.endpoints.lost(url, _now_ms())
            self._log_ejection(url, ejections, "session_lost", session_id=session_id)
        self.endpoints.release(url)

    def _refused(self, url: str) -> None:
        """A live session's reconnect to ``url`` was refused: nothing listens there any more; eject it at once."""
        ejections = self._ejections(url)
        self.endpoints.lost(url, _now_ms())
        self._log_ejection(url, ejections, "connection_refused")

    def _ejections(self, url: str) -> int:
        return self.endpoints.status(url)[0].ejections

    def _log_ejection(self, url: str, ejections_before: int, reason: str, **fields: str) -> None:
        """Log an ejection that just happened, and wake the prober: it has a probe to schedule."""
        if self._ejections(url) > ejections_before:
            log.warning("engine_endpoint_ejected", endpoint=url, reason=reason, **fields)
            self._wake.set()

    # --------------------------------------------------------------- probes

    def start(self) -> None:
        """Begin the health probes (in the running event loop), each endpoint's first at once: at the shipped 5 s
        and 3 failures, ``/readyz`` says ``no_engine`` about 10 s after the start where no engine answers (15 s
        when the first waited an interval). Optional: the first ``open`` or ``resume`` begins them too (on
        their routine); ``aclose`` ends them."""
        self.endpoints.probe_all_now(_now_ms())
        self._ensure_prober()
        self._wake.set()  # a prober already waiting (an open began it) probes now

    def _ensure_prober(self) -> None:
        if self._prober is None or self._prober.done():
            self._prober = asyncio.get_running_loop().create_task(self._probe_forever(), name="engine-pool-prober")

    async def _probe_forever(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        async with http_client(timeout=self.probe_timeout_s, headers=headers) as http:
            while True:
                due = self.endpoints.due_probes(_now_ms())
                if due:
                    await asyncio.gather(*(self._probe(http, url) for url in due))
                    continue
                deadline = self.endpoints.next_deadline_ms()
                timeout = None if deadline is None else max(0.0, (deadline - _now_ms()) / 1000)
                self._wake.clear()
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)

    async def _probe(self, http: httpx.AsyncClient, url: str) -> None:
        """GET the endpoint's ``/health``: any 2xx passes. ``engine-server`` also says how many sessions it
        holds (all its clients together), kept for the operator."""
        server_sessions: int | None = None
        try:
            response = await http.get(health_url(url))
            ok = response.is_success
            if ok and response.headers.get("content-type", "").startswith("application/json"):
                body = response.json()
                if isinstance(body, dict) and isinstance(body.get("sessions"), int):
                    server_sessions = body["sessions"]
        except (httpx.HTTPError, ValueError) as exc:
            ok = False
            log.debug("engine_probe_failed", endpoint=url, error=str(exc))
        except Exception:  # a bug here must not stop the probes of the other endpoints
            ok = False
            log.exception("engine_probe_crashed", endpoint=url)
        ejections = self._ejections(url)
        if self.endpoints.probe_done(url, ok, _now_ms(), server_sessions):
            log.info("engine_endpoint_restored", endpoint=url, by="probe")
        self._log_ejection(url, ejections, "probe_failures")
