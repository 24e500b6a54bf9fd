"""The lifecycle's effects on the server (``bridge/lifecycle_steps.py``'s ``LifecycleEffects``): a carrier stream's
dealings with the call's registry record and the engine, for the media driver (``bridge/media.py``).

What only the stream can do (check its token, find the call's setup, refuse itself, be superseded, report the
call over) it does through ``StreamHooks``; the rest is the registry's and the engine's, through the services.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from contextlib import suppress
from typing import Protocol

from structlog.stdlib import BoundLogger

from callbridge.bridge.call_config import session_config
from callbridge.bridge.call_setup import CallSetup, Rejection
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.fleet import LiveStream
from callbridge.bridge.lifecycle_steps import Rejected
from callbridge.bridge.pacing import monotonic_ms
from callbridge.bridge.registry import CallClaim, LiveCall, RegistryUnavailable, SignalKind, holder_process
from callbridge.bridge.stream_services import StreamServices
from callbridge.config import Settings
from callbridge.engine.errors import EngineError
from callbridge.engine.port import DuplexSession, ResumeTicket

__all__ = ["StreamEffects", "StreamHooks", "awaited", "not_back_after_ms"]

_ENGINE_CLOSE_WAIT_S = 0.05
"""How long a stream's end waits for its engine session's close before leaving it to the background."""
_BEFORE_THE_GRACE_MS = 2000
"""A dropped call's session is closed this long before the engine's grace would end it: while it still can be."""


def not_back_after_ms(settings: Settings) -> int:
    """For a carrier that names no reconnect window (its ``<Redirect>`` comes within a second or two, or never: the
    caller hung up meanwhile): a dropped stream's call that has not come back by now is over — its session closed,
    its report sent (``call.ended``), just before the engine's disconnect grace would have ended it unannounced."""
    return max(1000, int(settings.engine.disconnect_grace_s * 1000) - _BEFORE_THE_GRACE_MS)


class StreamHooks(LiveStream, Protocol):
    """What of a step only the stream itself can do (``MediaStreamDriver``)."""

    @property
    def log(self) -> BoundLogger: ...

    async def token_is_ours(self) -> bool: ...

    async def setup(self, *, choose: bool) -> CallSetup | Rejection | None: ...

    async def refuse(self, reason: EndCause, *, no_engine: bool) -> None: ...

    def call_over(self, end_reason: EndCause) -> None:
        """The call is over, its last stream gone: its report to the application."""
        ...


class StreamEffects:
    """The steps of one stream of ``call_id``, done against the process's services."""

    def __init__(self, services: StreamServices, call_id: str, holder: str, stream: StreamHooks) -> None:
        """``holder``: the stream, as the registry names the stream that holds a call."""
        self.services, self.call_id, self.holder, self.stream = services, call_id, holder, stream
        self.registry = services.registry

    @property
    def log(self) -> BoundLogger:
        return self.stream.log

    def now_ms(self) -> int:
        return monotonic_ms()

    async def token_is_ours(self) -> bool:
        return await self.stream.token_is_ours()

    async def ended_reason(self) -> str | None:
        return await self.registry.ended_reason(self.call_id)

    async def claim_call(self, unless_ended: bool) -> CallClaim:
        return await self.registry.claim_call(self.call_id, unless_ended)

    async def claim_live(self, holder: str) -> LiveCall | None:
        return await self.registry.claim_live(self.call_id, holder, self.holder)

    async def nudge_old_stream(self, holder: str | None) -> bool:
        old = self.services.live_streams.get(self.call_id)
        if old is not None:
            if old is not self.stream:
                self.services.spawn(old.superseded())
            return False
        await self.services.send_signal(self.call_id, SignalKind.STREAM_SUPERSEDED, "")
        if holder is None or holder_process(holder) == self.services.process_id:
            return False  # no live ticket to take it from; or here, and alive: its end parks what it holds
        try:
            return not await self.registry.listening(holder_process(holder))
        except RegistryUnavailable as exc:  # not known gone: waited for, as before this was asked
            self.log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
            return False

    async def sleep_until(self, at_ms: int) -> None:
        await asyncio.sleep(max(0, at_ms - monotonic_ms()) / 1000)

    async def take_answer_session(self) -> DuplexSession | None:
        assert self.services.answer_sessions is not None
        return await self.services.answer_sessions.take(self.call_id)

    async def resume(self, ticket: ResumeTicket) -> DuplexSession:
        return await self.services.engine.resume(ticket)

    async def open(self) -> DuplexSession | Rejected:
        setup = await self.stream.setup(choose=True)
        if isinstance(setup, str):
            return Rejected(setup)
        assistant = setup.assistant if setup is not None else None
        return await self.services.engine.open(session_config(self.services.settings, assistant))

    async def refuse(self, reason: EndCause, *, no_engine: bool) -> None:
        await self.stream.refuse(reason, no_engine=no_engine)

    async def mark_ended(self, reason: str) -> None:
        await self.registry.mark_ended(self.call_id, reason)

    async def detach(self, session: DuplexSession) -> ResumeTicket:
        return await session.detach()

    async def park(self, ticket: ResumeTicket, input_ms: int) -> bool:
        grace_ms = int(self.services.settings.engine.disconnect_grace_s * 1000)
        return await self.registry.detach(self.call_id, ticket, input_ms, grace_ms, holder=self.holder)

    async def close_parked(self, ticket: ResumeTicket, reason: str) -> bool:
        return await self.services.close_parked(ticket, reason)

    async def close_waiting(self, reason: str) -> bool:
        return await self.services.close_detached(self.call_id, reason, mark_ended=False)

    async def close_unless_back(self, ticket: ResumeTicket, after_ms: int) -> None:
        self.services.spawn(self._close_unless_back(ticket, after_ms))

    async def close_session(self, session: DuplexSession, reason: str) -> None:
        """Close the call's engine session; a server slow to confirm (stalled, far away) finishes it in the
        background, so the stream's end (the carrier's stop) is never held up by the engine."""
        closing = asyncio.ensure_future(_suppress_engine_error(session.close(reason)))
        done, _ = await asyncio.wait({closing}, timeout=_ENGINE_CLOSE_WAIT_S)
        if not done:
            self.services.spawn(awaited(closing))

    async def discard_answer_session(self, reason: str) -> None:
        if self.services.answer_sessions is not None:
            self.services.answer_sessions.discard(self.call_id, reason)

    async def _close_unless_back(self, ticket: ResumeTicket, window_ms: int) -> None:
        """A carrier whose stream comes back within ``window_ms`` if it comes back at all (one whose hang-up is its
        socket closing, as a drop is; or one that names no window: ``not_back_after_ms``): when none has (the ticket
        still waits), the call is over — marked so, its session closed where the engine still has it, its report
        sent."""
        await asyncio.sleep(window_ms / 1000)
        reason = EndReason.NO_RECONNECT
        try:
            waiting, _ = await self.registry.claim_ticket(self.call_id, ticket)
            if waiting is None:
                return  # a stream came back for it (here or elsewhere), or the call ended meanwhile
            await self.registry.mark_ended(self.call_id, reason)
        except RegistryUnavailable as exc:
            self.log.warning("registry_unavailable", operation=exc.operation, detail=exc.detail)
            return
        closed = await self.services.close_parked(waiting, reason)
        self.log.info("call_not_back", reason=reason.value, window_ms=window_ms, engine_session_closed=closed)
        self.stream.call_over(EndCause(reason))


async def _suppress_engine_error(work: Awaitable[None]) -> None:
    with suppress(EngineError):
        await work


async def awaited(future: Awaitable[object]) -> None:
    """Wait for ``future`` (a task handed to the background, ``BridgeServices.spawn``)."""
    await future
