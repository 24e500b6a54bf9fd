"""``callbridge engine-server``: the embedded engine behind vllm-omni's duplex websocket protocol.

Serves ``/v1/realtime`` (``?duplex=1``) and ``/v1/duplex`` as vllm-omni
0.30.0's ``OmniDuplexSessionHandler`` does (reference §4): the first frame
opens (``session.update``) or resumes (``session.resume``) a session;
``session.created`` carries a resume token and attachment generation; every
later event is journaled with ``server_event_seq``; ``session.event_ack``
trims the journal; a dropped socket detaches the session into the engine's
disconnect grace; a resume replays what the client missed, rotates the token
and tells a replaced socket ``session.replaced``. Errors use the nested shape;
a refused handshake ends without a close frame, as the real server's does.
Events are rendered as the real server's projection renders them
(``engine/projection.py``): a client written against vllm-omni works here
unchanged (``tests/engine/test_conformance.py`` checks it against the wheel).

The session pump is session-scoped: it outlives connections, journaling
while no socket is attached. One lock per session orders the pump's sends
against a resume's replay, so nothing is lost or doubled.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from fastapi import FastAPI, WebSocket, WebSocketDisconnect

from callbridge import __version__
from callbridge.codecs import AudioEncoding, StreamResampler
from callbridge.config import EngineServerSettings, Settings
from callbridge.engine.commands import AppendAudio
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.events import TERMINAL_EVENTS, SessionCreated, SessionResumed
from callbridge.engine.journal import (
    EventJournal,
    JournalGap,
    JournalOverflow,
    ResumeCredential,
)
from callbridge.engine.local.core import LocalEngineOptions
from callbridge.engine.local.engine import LocalEngine, LocalSession, monotonic_ms
from callbridge.engine.local.vad import VAD_RATE_HZ
from callbridge.engine.port import ResumeTicket
from callbridge.engine.projection import WireProjection, session_object
from callbridge.engine.wire import (
    MAX_CLIENT_EVENT_BYTES,
    InputFormat,
    error_to_wire,
    new_event_id,
    parse_client_command,
    session_config_from_wire,
)
from callbridge.logging import get_logger

__all__ = ["EngineServer", "create_engine_app", "local_engine_options"]

log = get_logger(__name__)

_FALSE = {"0", "false", "no", "off"}
_TRUE = {"1", "true", "yes", "on"}
_FORMAT_NAMES: Final = {AudioEncoding.PCMU: "g711_ulaw", AudioEncoding.PCMA: "g711_alaw", AudioEncoding.L16: "pcm16"}


@dataclass(eq=False)
class _Attachment:
    websocket: WebSocket
    generation: int


@dataclass(eq=False)
class _Entry:
    """What the server keeps per session, across connections."""

    session: LocalSession
    client_session: dict[str, Any]
    """The session keys the client declared (``session.update``), merged."""
    journal: EventJournal
    credential: ResumeCredential
    input_format: InputFormat
    projection: WireProjection
    token: str = ""
    attachment: _Attachment | None = None
    attachment_generation: int = 1
    resync_required: bool = False
    send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    resamplers: dict[int, StreamResampler] = field(default_factory=dict)
    pump: asyncio.Task[None] | None = None

    def to_engine_rate(self, command: AppendAudio) -> AppendAudio:
        """Appends reach the engine as PCM16 16 kHz, through one stateful resampler per input rate."""
        if command.rate_hz == VAD_RATE_HZ:
            return command
        resampler = self.resamplers.get(command.rate_hz)
        if resampler is None:
            resampler = self.resamplers[command.rate_hz] = StreamResampler(command.rate_hz, VAD_RATE_HZ)
        return AppendAudio(resampler.process(command.pcm), VAD_RATE_HZ)

    def public_session(self, *, engine_fields_only: bool = False) -> dict[str, Any]:
        session = self.session
        return session_object(
            session.session_id,
            self.client_session,
            session.capabilities,
            input_format=_FORMAT_NAMES.get(self.input_format.encoding, "pcm16"),
            input_rate_hz=self.input_format.rate_hz,
            epoch=session.epoch,
            state="closed" if session.closed else "open",
            engine_fields_only=engine_fields_only,
            model=session.model,
            idle_timeout_s=session.idle_timeout_s,
            turn=session.turn_facts(),
        )


def _dumps(payload: Mapping[str, Any]) -> str:
    return orjson.dumps(payload).decode()


async def _send(websocket: WebSocket, payload: Mapping[str, Any]) -> None:
    await websocket.send_text(_dumps(payload))


class EngineServer:
    """The websocket transport for a ``LocalEngine``."""

    def __init__(
        self,
        engine: LocalEngine,
        settings: EngineServerSettings,
        *,
        socket_idle_timeout_s: float = 300.0,
        clock: Callable[[], int] = monotonic_ms,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.socket_idle_timeout_s = socket_idle_timeout_s
        self.clock = clock
        self._entries: dict[str, _Entry] = {}

    # ----------------------------------------------------------- connection

    async def handle(self, websocket: WebSocket) -> None:
        """Serve one websocket connection until it closes."""
        await websocket.accept()
        entry: _Entry | None = None
        attachment: _Attachment | None = None
        try:
            model = _autostart_model(websocket)
            first: dict[str, Any] | None = None
            if model is not None:  # as vllm-omni's ``?model=``: the default session opens before any message
                opened = await self._open(websocket, {"model": model})
            else:
                first = await self._first_frame(websocket)
                if first is None:
                    return
                if first["type"] == "session.resume":
                    opened = await self._resume(websocket, first)
                else:
                    session_object = first.get("session") if first["type"] == "session.update" else {}
                    opened = await self._open(websocket, session_object if isinstance(session_object, dict) else {})
            if opened is None:
                return  # as vllm-omni: a refused handshake ends without a close frame (the client sees 1006)
            entry, attachment = opened
            if first is not None and first["type"] not in ("session.update", "session.resume"):
                await self._handle_event(entry, attachment, first)  # autostarted: the first event runs now
            await self._read_loop(entry, attachment)
        except WebSocketDisconnect:
            pass
        finally:
            if entry is not None and attachment is not None:
                await self._release(entry, attachment)

    async def _first_frame(self, websocket: WebSocket) -> dict[str, Any] | None:
        try:
            message = await asyncio.wait_for(websocket.receive(), self.settings.config_timeout_s)
        except TimeoutError:
            await _send(websocket, error_to_wire(ErrorCode.CONFIG_TIMEOUT, "Timeout waiting for session.update"))
            return None
        if message["type"] == "websocket.disconnect":
            raise WebSocketDisconnect(message.get("code", 1000))
        return await self._decode(websocket, message)

    async def _decode(self, websocket: WebSocket, message: Mapping[str, Any]) -> dict[str, Any] | None:
        """A received frame as a JSON object with a type, or None after telling the client what is wrong."""
        text = message.get("text")
        if text is None:
            await _send(websocket, error_to_wire(ErrorCode.BAD_EVENT, "binary frames are not part of the protocol"))
            return None
        if len(text) > MAX_CLIENT_EVENT_BYTES:
            await _send(websocket, error_to_wire(ErrorCode.EVENT_TOO_LARGE, "Duplex event too large"))
            return None
        try:
            payload = orjson.loads(text)
        except orjson.JSONDecodeError:
            await _send(websocket, error_to_wire(ErrorCode.INVALID_JSON, "Invalid JSON event"))
            return None
        if not isinstance(payload, dict) or not isinstance(payload.get("type"), str):
            await _send(websocket, error_to_wire(ErrorCode.BAD_EVENT, "Duplex event must be a JSON object with a type"))
            return None
        return payload

    async def _read_loop(self, entry: _Entry, attachment: _Attachment) -> None:
        websocket = attachment.websocket
        while not entry.session.closed:
            try:
                message = await asyncio.wait_for(websocket.receive(), self.socket_idle_timeout_s)
            except TimeoutError:
                log.info("engine_socket_idle", session_id=entry.session.session_id)
                return
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            if entry.attachment is not attachment:
                return  # a newer connection took the session over
            payload = await self._decode(websocket, message)
            if payload is not None:
                await self._handle_event(entry, attachment, payload)
        if entry.pump is not None:
            with suppress(Exception):
                await asyncio.wait_for(asyncio.shield(entry.pump), 5.0)

    async def _handle_event(self, entry: _Entry, attachment: _Attachment, payload: dict[str, Any]) -> None:
        websocket = attachment.websocket
        event_type = payload["type"]
        event_id = payload.get("event_id") if isinstance(payload.get("event_id"), str) else None
        if event_type == "session.event_ack":
            seq = payload.get("server_event_seq")
            try:
                if not isinstance(seq, int) or isinstance(seq, bool):
                    raise ValueError("session.event_ack requires a non-negative server_event_seq")
                entry.journal.acknowledge(seq)
            except ValueError as exc:
                await _send(websocket, error_to_wire(ErrorCode.INVALID_EVENT_ACK, str(exc), event_id))
            return
        if event_type == "session.resume":
            message = "session.resume must be the first message of a new connection"
            await _send(websocket, error_to_wire(ErrorCode.UNSUPPORTED_SESSION_RESUME, message, event_id))
            return
        try:
            if event_type == "session.update":
                update = payload.get("session")
                if not isinstance(update, dict):
                    raise EngineError(ErrorCode.BAD_EVENT, "session.update needs a session object")
                _, entry.input_format = session_config_from_wire({**entry.client_session, **update})
                entry.client_session.update(update)
                async with entry.send_lock:  # journaled, in order with the pump's events
                    await self._publish(entry, {"type": "session.updated", "event_id": new_event_id(), "session": entry.public_session()})
                return
            command = parse_client_command(payload, entry.input_format)
            if isinstance(command, AppendAudio):
                command = entry.to_engine_rate(command)
            await entry.session.submit(command)
        except EngineError as exc:
            await _send(websocket, error_to_wire(exc.code, exc.message, event_id))

    # -------------------------------------------------------------- open

    async def _open(self, websocket: WebSocket, client_session: dict[str, Any]) -> tuple[_Entry, _Attachment] | None:
        try:
            config, input_format = session_config_from_wire(client_session)
        except EngineError as exc:  # as vllm-omni: any session object it cannot open with is invalid_session_config
            await _send(websocket, error_to_wire(ErrorCode.INVALID_SESSION_CONFIG, exc.message))
            return None
        try:
            session = await self.engine.open(config)
        except EngineError as exc:
            await _send(websocket, error_to_wire(exc.code, exc.message))
            return None
        entry = _Entry(
            session,
            {key: value for key, value in client_session.items() if key not in ("id", "session_id")},
            EventJournal(
                max_bytes=self.settings.resume_replay_max_bytes,
                ttl_ms=int(self.settings.resume_replay_ttl_s * 1000),
            ),
            ResumeCredential(),
            input_format,
            WireProjection(session.session_id),
        )
        entry.token = entry.credential.issue()
        attachment = _Attachment(websocket, entry.attachment_generation)
        entry.attachment = attachment
        self._entries[session.session_id] = entry
        entry.pump = asyncio.create_task(self._pump(entry), name=f"engine-pump-{session.session_id}")
        log.info("engine_session_opened", session_id=session.session_id, input_rate_hz=input_format.rate_hz)
        return entry, attachment

    # ------------------------------------------------------------ resume

    async def _resume(self, websocket: WebSocket, request: dict[str, Any]) -> tuple[_Entry, _Attachment] | None:
        session_id = request.get("session_id")
        token = request.get("resume_token")
        last_seq = request.get("last_received_server_event_seq", 0)
        if (
            not isinstance(session_id, str)
            or not session_id
            or not isinstance(token, str)
            or not token
            or not isinstance(last_seq, int)
            or isinstance(last_seq, bool)
            or last_seq < 0
        ):
            message = "session.resume requires session_id, resume_token, and a non-negative event sequence"
            await _send(websocket, error_to_wire(ErrorCode.INVALID_SESSION_RESUME, message))
            return None
        entry = self._entries.get(session_id)
        if entry is None or entry.session.closed:
            message = f"Unknown or expired duplex session: {session_id}"
            await _send(websocket, error_to_wire(ErrorCode.SESSION_RESUME_EXPIRED, message))
            return None
        if not entry.credential.verify(token):
            await _send(websocket, error_to_wire(ErrorCode.INVALID_RESUME_TOKEN, "Invalid duplex session resume token"))
            return None
        async with entry.send_lock:
            try:
                replay = entry.journal.replay_after(last_seq, self.clock())
            except JournalGap:
                await _send(websocket, {"type": "session.resync_required", "event_id": new_event_id(), "session_id": session_id, "reason": "journal_gap"})
                return None
            except ValueError as exc:
                await _send(websocket, error_to_wire(ErrorCode.SESSION_RESUME_CONFLICT, str(exc)))
                return None
            try:
                await self.engine.resume(ResumeTicket(session_id, entry.session.lease_generation))
            except EngineError as exc:
                await _send(websocket, error_to_wire(ErrorCode.RUNTIME_RESUME_FAILED, str(exc)))
                return None
            replaced = entry.attachment
            entry.attachment_generation += 1
            entry.token = entry.credential.issue()
            attachment = _Attachment(websocket, entry.attachment_generation)
            entry.attachment = attachment
            if replaced is not None:
                with suppress(Exception):
                    await _send(
                        replaced.websocket,
                        {"type": "session.replaced", "event_id": new_event_id(), "session_id": session_id, "attachment_generation": replaced.generation},
                    )
                with suppress(Exception):
                    await replaced.websocket.close(1000, "session_replaced")
            resumed = {
                "type": "session.resumed",
                "event_id": new_event_id(),
                "session_id": session_id,
                "session": entry.public_session(engine_fields_only=True),
                "attachment_generation": entry.attachment_generation,
                "resume_token": entry.token,
            }
            await _send(websocket, resumed)
            for payload in replay:
                await _send(websocket, payload)
        log.info("engine_session_resumed", session_id=session_id, replayed=len(replay), generation=attachment.generation)
        return entry, attachment

    # -------------------------------------------------------------- pump

    async def _pump(self, entry: _Entry) -> None:
        session = entry.session
        reason = "session_closed"
        try:
            async for event in session.events():
                if isinstance(event, SessionResumed):
                    continue  # the resume handler announces it, with the rotated token
                async with entry.send_lock:
                    if isinstance(event, SessionCreated):
                        # as vllm-omni: session.created (not journaled: it carries the credential), then session.updated
                        session_body = entry.public_session()
                        created = {
                            "type": "session.created",
                            "event_id": new_event_id(),
                            "session": session_body,
                            "attachment_generation": entry.attachment_generation,
                            "resume_token": entry.token,
                        }
                        await self._send_current(entry, created)
                        await self._publish(entry, {"type": "session.updated", "event_id": new_event_id(), "session": session_body})
                        continue
                    for payload in entry.projection.project(event):
                        await self._publish(entry, payload)
                if isinstance(event, TERMINAL_EVENTS):
                    reason = getattr(event, "reason", reason)
                    break
        except Exception:
            log.exception("engine_pump_failed", session_id=session.session_id)
        finally:
            self._entries.pop(session.session_id, None)
            attachment, entry.attachment = entry.attachment, None
            if attachment is not None:
                with suppress(Exception):
                    await attachment.websocket.close(1000, reason)

    async def _publish(self, entry: _Entry, payload: dict[str, Any]) -> None:
        """Journal ``payload`` (with its ``server_event_seq``) and send it to the attached connection, if any.
        Hold ``entry.send_lock``."""
        if not entry.resync_required:
            try:
                payload = entry.journal.record(payload, self.clock())
            except JournalOverflow:
                entry.resync_required = True
                resync = {"type": "session.resync_required", "event_id": new_event_id(), "session_id": entry.session.session_id, "reason": "journal_overflow"}
                await self._send_current(entry, resync)
        await self._send_current(entry, payload)

    async def _send_current(self, entry: _Entry, payload: Mapping[str, Any]) -> None:
        attachment = entry.attachment
        if attachment is None:
            return
        try:
            await _send(attachment.websocket, payload)
        except Exception as exc:  # the socket died mid-send: a disconnect, not the end of the session
            log.info("engine_send_failed", session_id=entry.session.session_id, error=repr(exc))
            await self._release(entry, attachment)

    async def _release(self, entry: _Entry, attachment: _Attachment) -> None:
        """The connection ``attachment`` is gone: start the engine's grace unless a newer one took over."""
        if entry.attachment is not attachment:
            return
        entry.attachment = None
        if entry.session.closed:
            return
        with suppress(EngineError):
            await self.engine.detach_session(entry.session.session_id, entry.session.lease_generation)
        log.info("engine_session_detached", session_id=entry.session.session_id)


def _autostart_model(websocket: WebSocket) -> str | None:
    """``?model=`` names a session to open at once — unless ``?resume=1`` or ``?autostart=0`` says the first
    message decides (vllm-omni's ``RealtimeEnvelope.initial_open_payload``)."""
    params = websocket.query_params
    model = params.get("model")
    resume_only = str(params.get("resume")).lower() in _TRUE or str(params.get("autostart")).lower() in _FALSE
    return model if model and not resume_only else None


def local_engine_options(settings: Settings) -> LocalEngineOptions:
    local = settings.local_engine
    return LocalEngineOptions(
        agent=local.agent,
        chunk_ms=local.chunk_ms,
        generation_speed=local.generation_speed,
        disconnect_grace_ms=int(settings.engine.disconnect_grace_s * 1000),
        idle_ttl_ms=int(local.idle_ttl_s * 1000),
        max_sessions=local.max_sessions,
    )


def create_engine_app(settings: Settings, engine: LocalEngine | None = None) -> FastAPI:
    """The engine server's ASGI app: ``/v1/realtime``, ``/v1/duplex``, ``/health``, ``/v1/models``."""
    engine = engine or LocalEngine(local_engine_options(settings))
    server = EngineServer(engine, settings.engine_server, socket_idle_timeout_s=settings.local_engine.idle_ttl_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await engine.warm_up()
        log.info("engine_server_started", agent=engine.options.agent, version=__version__)
        yield
        await engine.aclose()

    app = FastAPI(title="callbridge engine server", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.engine_server = server

    @app.websocket("/v1/realtime")
    async def realtime(websocket: WebSocket) -> None:
        if str(websocket.query_params.get("duplex", "1")).lower() in _FALSE:
            # as vllm-omni on a duplex deployment: no turn-based Realtime API, said then closed normally
            await websocket.accept()
            await _send(websocket, {"type": "error", "error": "Realtime API is not available", "code": "unsupported"})
            await websocket.close()
            return
        await server.handle(websocket)

    @app.websocket("/v1/duplex")
    async def duplex(websocket: WebSocket) -> None:
        await server.handle(websocket)

    @app.get("/health")
    async def health() -> dict[str, str | int]:
        """Up; ``sessions``: sessions held (live or detached in their grace), what a fleet balances on."""
        return {"status": "ok", "sessions": engine.session_count}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": f"callbridge-local-{settings.local_engine.agent}", "object": "model"}]}

    return app

