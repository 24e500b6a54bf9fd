"""An adapter over ``vllm_omni.entrypoints.duplex_omni.DuplexOmni`` in this process (extra ``omni``).

For one GPU box running the model and the bridge together. vllm-omni is
imported lazily, never at package import, so callbridge installs and runs
without it.

Commands travel as the Realtime client events ``wire.py`` builds, through
vllm-omni's own ``command_from_realtime`` with the session's input defaults:
that is what converts PCM16 at the call's rate into the ``pcm_f32le`` 16 kHz
the models take (appending typed ``AppendAudio`` would bypass it, §3.2).
Sessions open from a Realtime mapping, never a bare ``DuplexSessionConfig``,
which would keep ``response_format="wav"`` and send a WAV file per chunk
(§2.2). Events are read back through their ``to_realtime()`` wire form, so one
parser (``wire.parse_server_event``) serves this adapter and the wire client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import suppress
from typing import Any

from callbridge.engine.commands import CloseSession, EngineCommand
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.events import TERMINAL_EVENTS, Capabilities, EngineEvent
from callbridge.engine.late_audio import LateAudioFilter
from callbridge.engine.port import (
    DuplexEngine,
    DuplexSession,
    ResumeTicket,
    SessionConfig,
)
from callbridge.engine.wire import command_to_wire, parse_server_event
from callbridge.logging import get_logger

__all__ = ["InlineEngine", "InlineSession"]

log = get_logger(__name__)


def _engine_error(exc: Exception, session_id: str | None = None) -> EngineError:
    """vllm-omni's ``DuplexSessionError`` / ``DuplexCommandError`` → ``EngineError`` with the same code."""
    code = getattr(exc, "code", None) or ErrorCode.INTERNAL_ERROR
    retryable = getattr(exc, "retryable", None)
    return EngineError(str(code), str(exc), retryable=retryable if isinstance(retryable, bool) else None, session_id=session_id)


class InlineEngine(DuplexEngine):
    """Duplex sessions of a ``DuplexOmni`` running in this process."""

    def __init__(self, omni: Any) -> None:
        self.omni = omni

    @classmethod
    def create(cls, model: str, **omni_kwargs: Any) -> InlineEngine:
        """Start vllm-omni in this process (GPU, extra ``omni``): ``DuplexOmni(model, **omni_kwargs)``."""
        from vllm_omni.entrypoints.duplex_omni import DuplexOmni

        return cls(DuplexOmni(model, **omni_kwargs))

    async def open(self, config: SessionConfig) -> InlineSession:
        session_payload = config.to_realtime()
        try:
            handle = await self.omni.open_session(session_payload)
        except Exception as exc:
            raise _engine_error(exc) from exc
        return InlineSession(self, handle, session_payload)

    async def resume(self, ticket: ResumeTicket) -> InlineSession:
        handle = self.omni.get_session(ticket.session_id)
        if handle is None or handle.closed:
            raise EngineError(ErrorCode.SESSION_RESUME_EXPIRED, f"unknown or expired {ticket.session_id}")
        try:
            await self.omni.resume_session(ticket.session_id, expected_lease_generation=ticket.lease_generation)
        except Exception as exc:
            raise _engine_error(exc, ticket.session_id) from exc
        session: InlineSession | None = getattr(handle, "_callbridge_session", None)
        if session is None:
            session = InlineSession(self, handle, dict(handle.public_session))
        session._detached = False
        return session

    async def aclose(self) -> None:
        with suppress(Exception):
            await self.omni.close_all_sessions(reason="shutdown")


class InlineSession(DuplexSession):
    """A ``DuplexSessionHandle`` behind the port."""

    def __init__(self, engine: InlineEngine, handle: Any, session_payload: dict[str, Any]) -> None:
        from vllm_omni.engine.duplex.commands import command_from_realtime
        from vllm_omni.protocol.duplex import RealtimeInputDefaults

        self._engine = engine
        self._handle = handle
        self._translate = command_from_realtime
        self._defaults = RealtimeInputDefaults().with_session_payload(session_payload)
        self.session_id: str = handle.session_id
        caps = handle.capabilities
        self.capabilities = Capabilities.from_wire(caps.as_dict() if hasattr(caps, "as_dict") else dict(caps or {}))
        self._late_audio = LateAudioFilter()
        self._detached = False
        self._detach_signal = asyncio.Event()
        handle._callbridge_session = self

    @property
    def closed(self) -> bool:
        return bool(self._handle.closed)

    def resume_ticket(self) -> ResumeTicket:
        return ResumeTicket(self.session_id, lease_generation=int(self._handle.lease_generation))

    async def submit(self, command: EngineCommand) -> None:
        if isinstance(command, CloseSession):
            await self.close(command.reason)
            return
        try:
            omni_command = self._translate(command_to_wire(command), defaults=self._defaults)
            await self._handle.submit(omni_command)
        except Exception as exc:
            raise _engine_error(exc, self.session_id) from exc

    async def events(self) -> AsyncIterator[EngineEvent]:
        source = self._handle.events()
        self._detach_signal.clear()
        detached = asyncio.ensure_future(self._detach_signal.wait())
        pending: asyncio.Future[Any] | None = None
        try:
            while not self._detached:
                pending = asyncio.ensure_future(anext(source))
                await asyncio.wait({pending, detached}, return_when=asyncio.FIRST_COMPLETED)
                if not pending.done():
                    return  # detached: the handle keeps its events for the next consumer
                next_event, pending = pending, None
                try:
                    omni_event = next_event.result()
                except StopAsyncIteration:
                    return
                try:
                    parsed = parse_server_event(omni_event.to_realtime())
                except EngineError as exc:
                    log.warning("inline_event_unparsed", session_id=self.session_id, error=exc.message)
                    continue
                if parsed.event is None or not self._late_audio.admit(parsed.event):
                    continue
                yield parsed.event
                if isinstance(parsed.event, TERMINAL_EVENTS):
                    return
        finally:
            detached.cancel()
            if pending is not None and not pending.done():
                pending.cancel()
                with suppress(asyncio.CancelledError, StopAsyncIteration):
                    await pending
            await source.aclose()

    async def detach(self) -> ResumeTicket:
        """Start the engine's disconnect grace, fenced on this handle's lease generation."""
        try:
            await self._engine.omni.detach_session(
                self.session_id, expected_lease_generation=int(self._handle.lease_generation)
            )
        except Exception as exc:
            raise _engine_error(exc, self.session_id) from exc
        self._detached = True
        self._detach_signal.set()
        return self.resume_ticket()

    async def close(self, reason: str = "client_close") -> None:
        if self.closed:
            return
        try:
            await self._handle.close(reason=reason)
        except Exception as exc:
            raise _engine_error(exc, self.session_id) from exc
