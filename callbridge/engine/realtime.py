"""A client for vllm-omni's duplex websocket (``/v1/realtime?duplex=1&autostart=0``), written here.

vllm-omni's own ``DuplexClient`` cannot be imported without torch and vllm
(reference §4.6), so this is the small wire client the bridge needs:

- open: ``session.update`` as the first frame, input rate declared; wait for
  ``session.created`` and keep ``session_id``, ``resume_token``,
  ``attachment_generation``;
- steady state: a reader task parses frames into typed events, drops
  replayed duplicates by ``server_event_seq``, acknowledges sequences
  (``session.event_ack``) every few events and with every heartbeat, and
  drops audio of a cancelled response or an older epoch (§5.2);
- liveness: a websocket ping every ``liveness_interval_s``; one unanswered
  for ``liveness_timeout_s`` means the server stopped answering (a stalled or
  frozen process keeps its socket open): the socket is dropped and resumed
  as below. vllm-omni's own ``session.heartbeat`` goes every
  ``heartbeat_interval_s``;
- a socket that drops without a terminal event is resumed transparently:
  ``session.resume`` with the latest token and last sequence on a new
  socket; the rotated token is adopted and the event stream continues,
  nothing lost or doubled. The attempts stop ``reconnect_budget_s`` after
  the server was last heard from, or after this process ran again from a
  stall of its own (independent of the server's disconnect
  grace, which can be 30 s): the session then ends with
  ``connection_failed``, which the call hears as the failure tone and a
  hang-up, within a few seconds of the server's death. A fatal resume code
  ends the session with that reason;
- ``submit`` never waits for a reconnect: audio submitted while the socket is
  down is dropped (it would be stale) and counted; other commands are kept,
  in order (bounded; a newer ``playback.ack`` of a response replaces an older
  one), and sent on the new socket before anything else;
- ``detach()`` closes the socket (the server starts its grace) and returns a
  ``ResumeTicket`` any process can resume with.

Malformed or unknown server frames are logged and skipped; the session goes on.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from callbridge.engine.commands import AckPlayback, AppendAudio, CloseSession, EngineCommand
from callbridge.engine.errors import FATAL_RESUME_CODES, EngineError, ErrorCode
from callbridge.engine.event_stream import EventStream
from callbridge.engine.events import (
    TERMINAL_EVENTS,
    Capabilities,
    EngineErrorEvent,
    EngineEvent,
    SessionClosed,
    SessionCreated,
    SessionExpired,
    SessionResumed,
)
from callbridge.engine.late_audio import LateAudioFilter
from callbridge.engine.port import (
    DuplexEngine,
    DuplexSession,
    ResumeTicket,
    SessionConfig,
)
from callbridge.engine.wire import (
    command_to_wire,
    event_ack,
    parse_server_event,
    session_resume,
    session_update,
)
from callbridge.logging import get_logger
from callbridge.stall import PROCESS_STALL_MS

__all__ = ["RealtimeEngine", "RealtimeSession", "duplex_url"]

log = get_logger(__name__)

_MAX_FRAME_BYTES: Final = 16 * 1024 * 1024
_MAX_BACKLOG: Final = 64
"""Commands kept while the socket is being replaced (acks coalesce per response); past it the oldest go."""
_CLOSE_WAIT_S: Final = 5.0
"""How long ``close`` waits for the server's ``session.closed``."""
_CLOSE_HANDSHAKE_S: Final = 1.0
"""How long closing a socket waits for the server's close frame (a frozen server sends none: websockets' default
of 10 s held a drain that long)."""


def duplex_url(url: str) -> str:
    """``ws://host:port`` → ``ws://host:port/v1/realtime?duplex=1&autostart=0`` (never autostart, §4.2)."""
    parts = urlsplit(url)
    path = parts.path if parts.path not in ("", "/") else "/v1/realtime"
    query = dict(parse_qsl(parts.query))
    query |= {"duplex": "1", "autostart": "0"}
    return urlunsplit((parts.scheme, parts.netloc, path, urlencode(query), ""))


class RealtimeEngine(DuplexEngine):
    """vllm-omni servers (or ``callbridge engine-server``) over websockets."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        handshake_timeout_s: float = 10.0,
        heartbeat_interval_s: float = 30.0,
        reconnect_budget_s: float = 2.0,
        liveness_interval_s: float = 1.0,
        liveness_timeout_s: float = 1.0,
        reconnect_backoff_s: tuple[float, float] = (0.05, 0.5),
        ack_every_events: int = 16,
    ) -> None:
        self.url = duplex_url(url)
        self.api_key = api_key
        self.handshake_timeout_s = handshake_timeout_s
        self.heartbeat_interval_s = heartbeat_interval_s
        self.reconnect_budget_s = reconnect_budget_s
        self.liveness_interval_s = liveness_interval_s
        self.liveness_timeout_s = liveness_timeout_s
        self.reconnect_backoff_s = reconnect_backoff_s
        self.ack_every_events = ack_every_events
        self.on_unreachable: Callable[[], None] | None = None
        """Called when a live session's reconnect finds the server refusing connections (the engine pool ejects
        the endpoint at once: new calls go elsewhere)."""
        self._sessions: set[RealtimeSession] = set()

    async def open(self, config: SessionConfig) -> RealtimeSession:
        ws = await self._connect(self.url)
        try:
            await ws.send(orjson.dumps(session_update(config)).decode())
            first = await self._handshake_event(ws)
        except BaseException:
            await ws.close()
            raise
        if not isinstance(first, SessionCreated):
            await ws.close()
            raise EngineError(ErrorCode.PROTOCOL_ERROR, f"expected session.created, got {type(first).__name__}")
        session = RealtimeSession(self, ws, self.url, first.session_id, first.capabilities, first.resume_token, 0)
        session._start()
        return session

    async def resume(self, ticket: ResumeTicket) -> RealtimeSession:
        endpoint = ticket.endpoint or self.url
        if not ticket.resume_token:
            raise EngineError(ErrorCode.INVALID_SESSION_RESUME, "no resume token", session_id=ticket.session_id)
        ws = await self._connect(endpoint)
        try:
            await ws.send(orjson.dumps(session_resume(ticket)).decode())
            first = await self._handshake_event(ws)
        except BaseException:
            await ws.close()
            raise
        if not isinstance(first, SessionResumed):
            await ws.close()
            raise EngineError(ErrorCode.PROTOCOL_ERROR, f"expected session.resumed, got {type(first).__name__}")
        capabilities = first.capabilities or Capabilities(supports_session_resume=True)
        session = RealtimeSession(
            self, ws, endpoint, ticket.session_id, capabilities, first.resume_token, ticket.last_event_seq
        )
        session._start()
        return session

    async def aclose(self) -> None:
        for session in list(self._sessions):
            with suppress(EngineError):
                await session.close("shutdown")

    async def _connect(self, url: str, timeout_s: float | None = None) -> ClientConnection:
        """A websocket to ``url``. Raises ``EngineError(connection_failed)``; ``refused`` is set on it when the
        server's port refused the connection (nothing listens: the server is down)."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
        try:
            return await connect(
                url,
                additional_headers=headers,
                open_timeout=self.handshake_timeout_s if timeout_s is None else timeout_s,
                max_size=_MAX_FRAME_BYTES,
                ping_interval=None,  # the session's keepalive pings, and acts on a missed pong itself
                close_timeout=_CLOSE_HANDSHAKE_S,
                compression=None,
            )
        except (OSError, TimeoutError, InvalidHandshake, InvalidURI) as exc:
            refused = isinstance(exc, ConnectionRefusedError)
            raise EngineError(ErrorCode.CONNECTION_FAILED, f"{url}: {exc}", refused=refused) from exc

    async def _handshake_event(self, ws: ClientConnection, timeout_s: float | None = None) -> EngineEvent:
        """The first typed event the server answers a handshake with; errors raise ``EngineError``."""
        deadline = time.monotonic() + (self.handshake_timeout_s if timeout_s is None else timeout_s)
        while True:
            try:
                raw = await asyncio.wait_for(ws.recv(), max(0.0, deadline - time.monotonic()))
            except TimeoutError as exc:
                raise EngineError(ErrorCode.TIMEOUT, "no handshake answer") from exc
            except ConnectionClosed as exc:
                raise EngineError(ErrorCode.CONNECTION_FAILED, f"closed during handshake: {exc}") from exc
            payload = _loads(raw)
            if payload is None:
                continue
            if payload.get("type") == "session.resync_required":
                raise EngineError(ErrorCode.RESYNC_REQUIRED, str(payload.get("reason", "journal_gap")))
            parsed = parse_server_event(payload)
            if isinstance(parsed.event, EngineErrorEvent):
                raise EngineError(parsed.event.code, parsed.event.message, retryable=parsed.event.retryable)
            if parsed.event is not None:
                return parsed.event


def _loads(raw: str | bytes) -> dict[str, Any] | None:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        log.warning("engine_frame_not_json", size=len(raw))
        return None
    if not isinstance(payload, dict):
        log.warning("engine_frame_not_object")
        return None
    return payload


class RealtimeSession(DuplexSession):
    """One duplex session over a websocket that may be replaced underneath (transparent resume)."""

    def __init__(
        self,
        engine: RealtimeEngine,
        ws: ClientConnection,
        endpoint: str,
        session_id: str,
        capabilities: Capabilities,
        resume_token: str | None,
        last_seq: int,
    ) -> None:
        self._engine = engine
        self._ws = ws
        self._endpoint = endpoint
        self.session_id = session_id
        self.capabilities = capabilities
        self._token = resume_token
        self._last_seq = last_seq
        """The newest server event received (replays at or below it are dropped)."""
        self._acked_seq = last_seq
        self._ack_limit: int | None = None
        """``limit_acks``: no ack beyond this (None: none)."""
        self._consumed_seq = last_seq
        """The newest server event the consumer has taken: what acks and an exported ticket name, so that events
        received but not yet taken when the session is detached are replayed to whoever resumes it."""
        self._queued_seqs: deque[int] = deque()
        """The position after each event queued for the consumer and not yet known to be taken, oldest first."""
        self._stream = EventStream(session_id)
        self._connected = asyncio.Event()
        self._connected.set()
        self._closed = False
        self._detached = False
        self._close_sent = False
        """``session.close`` has gone to the server (once per session, whoever asked)."""
        self._closing_socket: object | None = None
        """The socket ``session.close`` went out on: its closing is the end asked for, not a loss to resume from."""
        self._backlog: deque[EngineCommand] = deque()
        """Commands submitted while the socket is being replaced, sent first on the new one."""
        self._heard_from_at = time.monotonic()
        """When the server last showed it is alive (a frame, a pong): the reconnect budget counts from here."""
        self._liveness_due_at = self._heard_from_at
        """When the liveness loop's current wait ends (its sleep, or the pong it waits for)."""
        self._stall_ended_at = 0.0
        """When this process last ran again after a stall of its own (the liveness loop ``PROCESS_STALL_MS`` or more
        past the end of its wait): the server cannot have been heard from while this process did not run."""
        self._terminal_seen = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self._late_audio = LateAudioFilter()
        self.dropped_audio_bytes = 0
        """Input audio dropped while the socket was being replaced."""
        self.resumes = 0
        self.on_release: Callable[[EngineEvent | None], None] | None = None
        """Called once when the session leaves this client: with its terminal event when it ends, with None when
        it is detached (the engine pool counts sessions per server with it)."""

    @property
    def closed(self) -> bool:
        return self._closed

    def resume_ticket(self) -> ResumeTicket:
        """Where the consumer stands: a resume replays every event after what it has taken."""
        return ResumeTicket(self.session_id, 0, self._token, self._taken_through(), self._endpoint)

    def _taken_through(self) -> int:
        """The position after the newest event the consumer has taken (events are taken in order)."""
        seqs, queued = self._queued_seqs, self._stream.queued
        if not queued:  # everything received was taken, or needed no taking (skipped, late audio)
            seqs.clear()
            self._consumed_seq = self._last_seq
        while len(seqs) > queued:
            self._consumed_seq = seqs.popleft()
        return self._consumed_seq

    def _start(self) -> None:
        self._engine._sessions.add(self)
        self._reader = asyncio.create_task(self._read_forever(), name=f"realtime-reader-{self.session_id}")
        self._keepalive = asyncio.create_task(self._keep_alive(), name=f"realtime-keepalive-{self.session_id}")

    # ------------------------------------------------------------- commands

    async def submit(self, command: EngineCommand) -> None:
        """Send ``command``; while the socket is being replaced, keep it for the new one (audio is dropped)
        rather than wait. Raises ``EngineError(session_closed)`` on a closed or detached session."""
        if self._closed:
            raise EngineError(ErrorCode.SESSION_CLOSED, "session is closed", session_id=self.session_id)
        if self._detached:
            raise EngineError(ErrorCode.SESSION_CLOSED, "session is detached", session_id=self.session_id)
        if isinstance(command, CloseSession):
            if self._close_sent:
                return  # one session.close per session: the server answers a second with session_closed
            self._close_sent = True
        if not self._connected.is_set():
            self._keep(command)
            return
        try:
            await self._ws.send(orjson.dumps(command_to_wire(command)).decode())
        except ConnectionClosed:  # the reader notices and resumes
            self._keep(command)
            return
        if isinstance(command, CloseSession):
            self._closing_socket = self._ws

    def _keep(self, command: EngineCommand) -> None:
        """Hold a command for the socket that replaces the lost one: not audio (stale by then); a newer ack of a
        response replaces the one kept."""
        if isinstance(command, AppendAudio):
            self.dropped_audio_bytes += len(command.pcm)
            return
        backlog = self._backlog
        if isinstance(command, AckPlayback):
            for i, kept in enumerate(backlog):
                if isinstance(kept, AckPlayback) and kept.response_id == command.response_id:
                    del backlog[i]
                    break
        if len(backlog) >= _MAX_BACKLOG:
            dropped = backlog.popleft()
            log.warning("engine_command_dropped", session_id=self.session_id, command=type(dropped).__name__)
        backlog.append(command)

    # -------------------------------------------------------------- events

    def take_ready_events(self) -> list[EngineEvent]:
        return self._stream.take_ready()

    def events(self) -> AsyncIterator[EngineEvent]:
        return self._stream.iterate()

    def _deliver(self, event: EngineEvent) -> None:
        """Queue an event for the consumer, unless it is late audio (reference §5.2)."""
        if not self._late_audio.admit(event):
            return
        self._stream.put(event)
        self._queued_seqs.append(self._last_seq)
        if isinstance(event, TERMINAL_EVENTS):
            self._end()
            self._released(event)

    def _released(self, event: EngineEvent | None) -> None:
        callback, self.on_release = self.on_release, None
        if callback is not None:
            callback(event)

    def _end(self) -> None:
        self._closed = True
        self._terminal_seen.set()
        self._connected.set()  # wake anyone waiting to send: they will see closed
        self._stream.finish()
        self._engine._sessions.discard(self)
        if self._keepalive is not None:
            self._keepalive.cancel()

    # -------------------------------------------------------------- reader

    async def _read_forever(self) -> None:
        try:
            while not self._closed and not self._detached:
                try:
                    await self._read_socket()
                except ConnectionClosed:
                    pass
                if self._closed or self._detached:
                    break
                if self._closing_socket is self._ws:  # closed by the server after our session.close, before its
                    self._deliver(SessionClosed(self.session_id, "client_close"))  # session.closed: that end
                    break
                self._connected.clear()
                await self._reconnect()
        except Exception:
            log.exception("engine_reader_failed", session_id=self.session_id)
            self._deliver(SessionClosed(self.session_id, "client_error"))
        if self._closed:  # the session ended (a terminal event): nothing more comes on its socket, which is ours to
            await self._ws.close()  # close, whether or not ``close()`` is called (a driver skips a closed session)

    async def _read_socket(self) -> None:
        async for raw in self._ws:
            self._heard_from_at = time.monotonic()
            payload = _loads(raw)
            if payload is None:
                continue
            if payload.get("type") == "session.resync_required":
                self._deliver(SessionClosed(self.session_id, f"resync_required:{payload.get('reason')}"))
                return
            try:
                parsed = parse_server_event(payload)
            except EngineError as exc:
                log.warning("engine_frame_malformed", session_id=self.session_id, error=exc.message)
                continue
            if parsed.server_event_seq is not None:
                if parsed.server_event_seq <= self._last_seq:
                    continue  # a replay of something already delivered
                self._last_seq = parsed.server_event_seq
            if parsed.event is None:
                log.debug("engine_event_skipped", session_id=self.session_id, type=parsed.type)
            elif isinstance(parsed.event, SessionResumed):
                self._token = parsed.event.resume_token
            else:
                self._deliver(parsed.event)
                if self._closed:
                    return
            if self._taken_through() - self._acked_seq >= self._engine.ack_every_events:
                await self._send_ack()

    def limit_acks(self, through_seq: int | None) -> None:
        self._ack_limit = through_seq

    async def _send_ack(self) -> None:
        seq = self._taken_through()
        if self._ack_limit is not None:
            seq = min(seq, self._ack_limit)
        if seq > self._acked_seq:
            await self._ws.send(orjson.dumps(event_ack(seq)).decode())
            self._acked_seq = seq

    async def _reconnect(self) -> None:
        """Resume on a new socket within the reconnect budget (from when the server was last heard from, or from
        the end of this process's latest stall), or end the session: ``connection_failed``, or the fatal resume code
        the server answered."""
        engine = self._engine
        deadline = max(self._heard_from_at, self._running_again_at()) + engine.reconnect_budget_s
        delay, max_delay = engine.reconnect_backoff_s
        while not self._closed and not self._detached:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                log.warning("engine_unreachable", session_id=self.session_id, endpoint=self._endpoint,
                            budget_s=engine.reconnect_budget_s)  # fmt: skip
                self._deliver(SessionClosed(self.session_id, ErrorCode.CONNECTION_FAILED))
                return
            try:
                ws: ClientConnection | None = await engine._connect(self._endpoint, left_s)
            except EngineError as exc:
                ws = None
                if exc.refused and engine.on_unreachable is not None:
                    engine.on_unreachable()
            if ws is not None:
                try:
                    # from what this client has received: what is queued here is not wanted twice
                    received = ResumeTicket(self.session_id, 0, self._token, self._last_seq, self._endpoint)
                    try:
                        await ws.send(orjson.dumps(session_resume(received)).decode())
                    except ConnectionClosed as closed:  # accepted, then closed at once: try again
                        raise EngineError(ErrorCode.CONNECTION_FAILED, f"closed before resume: {closed}") from closed
                    first = await engine._handshake_event(ws, max(0.05, deadline - time.monotonic()))
                except EngineError as exc:
                    await ws.close()
                    if exc.code in FATAL_RESUME_CODES:
                        reason_cls = SessionExpired if exc.code == ErrorCode.SESSION_RESUME_EXPIRED else SessionClosed
                        log.warning("engine_resume_refused", session_id=self.session_id, code=exc.code)
                        self._deliver(reason_cls(self.session_id, exc.code))
                        return
                else:
                    if isinstance(first, SessionResumed):
                        await self._adopt_socket(ws, first)
                        return
                    await ws.close()
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, max_delay)

    async def _adopt_socket(self, ws: ClientConnection, resumed: SessionResumed) -> None:
        """The resumed socket replaces the lost one: what was kept meanwhile goes first, in order."""
        self._ws = ws
        self._token = resumed.resume_token
        self._acked_seq = self._last_seq
        self._heard_from_at = time.monotonic()
        self.resumes += 1
        try:
            while self._backlog:
                command = self._backlog[0]
                await ws.send(orjson.dumps(command_to_wire(command)).decode())
                self._backlog.popleft()
                if isinstance(command, CloseSession):
                    self._closing_socket = ws
        except ConnectionClosed:
            return  # lost again at once: the reader tries again, the rest still kept
        self._connected.set()
        log.info("engine_session_resumed", session_id=self.session_id, last_seq=self._last_seq)

    def _running_again_at(self) -> float:
        """The end of this process's latest stall (0: none seen): the liveness loop's wait ended
        ``PROCESS_STALL_MS`` or more before it ran, or before now. Time this process did not run is not the
        server's silence: after a stall the reconnect budget counts from its end (the server's close of that time,
        or a missed ping of its own, sat unread meanwhile), however long ago the server was last heard from."""
        now = time.monotonic()
        if now - self._liveness_due_at >= PROCESS_STALL_MS / 1000:
            self._stall_ended_at = self._liveness_due_at = now
        return self._stall_ended_at

    async def _keep_alive(self) -> None:
        """A ping every ``liveness_interval_s``; a pong that does not come within ``liveness_timeout_s`` drops the
        socket (the reader resumes, or gives up within the budget). vllm-omni's ``session.heartbeat`` (and an ack)
        every ``heartbeat_interval_s``."""
        engine = self._engine
        heartbeat_at = time.monotonic() + engine.heartbeat_interval_s
        while not self._closed:
            self._liveness_due_at = time.monotonic() + engine.liveness_interval_s
            await asyncio.sleep(engine.liveness_interval_s)
            self._running_again_at()
            if not self._connected.is_set() or self._detached or self._closed:
                continue
            ws = self._ws
            try:
                pong = await ws.ping()
                self._liveness_due_at = time.monotonic() + engine.liveness_timeout_s
                await asyncio.wait_for(pong, engine.liveness_timeout_s)
                self._running_again_at()
                self._heard_from_at = time.monotonic()
                if time.monotonic() >= heartbeat_at:
                    heartbeat_at = time.monotonic() + engine.heartbeat_interval_s
                    await ws.send('{"type":"session.heartbeat"}')
                    await self._send_ack()
            except ConnectionClosed:
                continue  # the reader has it
            except TimeoutError:
                if ws is self._ws and not self._detached and not self._closed:
                    log.warning("engine_not_answering", session_id=self.session_id, endpoint=self._endpoint,
                                timeout_s=engine.liveness_timeout_s)  # fmt: skip
                    ws.transport.abort()  # the reader sees the socket closed and resumes

    # ----------------------------------------------------------- lifecycle

    async def detach(self) -> ResumeTicket:
        """Close the socket without ending the session: the server holds it for its grace. Never waits on a
        server that is being reconnected to: that attempt is abandoned (the ticket resumes from here)."""
        self._detached = True
        self._stream.pause()
        if self._keepalive is not None:
            self._keepalive.cancel()
        if self._connected.is_set():
            with suppress(ConnectionClosed):
                await self._send_ack()
        elif self._reader is not None:
            self._reader.cancel()
        await self._ws.close()
        if self._reader is not None:
            with suppress(asyncio.CancelledError):
                await self._reader
        self._engine._sessions.discard(self)
        self._released(None)
        return self.resume_ticket()

    async def close(self, reason: str = "client_close") -> None:
        """End the session: ``session.close`` (once, if not already sent), then wait a moment for the server's
        ``session.closed``. A server that cannot be reached is not waited for (its grace ends the session)."""
        if self._closed:
            return
        if self._connected.is_set() and not self._detached:
            with suppress(EngineError):
                await self.submit(CloseSession(reason))
            if self._close_sent and self._connected.is_set():
                with suppress(TimeoutError):
                    await asyncio.wait_for(self._terminal_seen.wait(), min(_CLOSE_WAIT_S, self._engine.handshake_timeout_s))
        if not self._closed:
            self._deliver(SessionClosed(self.session_id, reason))
        await self._ws.close()
        if self._reader is not None:
            self._reader.cancel()
            with suppress(asyncio.CancelledError):
                await self._reader
