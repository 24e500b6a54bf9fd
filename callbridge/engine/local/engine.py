"""The embedded CPU engine: ``LocalSessionCore`` behind the ``DuplexEngine`` port.

This layer only moves time and events: each command is applied to the core
at once (no task hop), the core's events go to the session's queue, and one
timer per session wakes the core at its next deadline. ``clock`` returns
monotonic ms and is injectable.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Callable

from callbridge.engine.commands import CloseSession, EngineCommand
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.event_stream import EventStream
from callbridge.engine.events import Capabilities, EngineEvent
from callbridge.engine.local.agents import AGENTS
from callbridge.engine.local.core import (
    LocalEngineOptions,
    LocalSessionCore,
    SessionState,
)
from callbridge.engine.local.vad import FrameScorer, warm_up_silero
from callbridge.engine.port import (
    DuplexEngine,
    DuplexSession,
    ResumeTicket,
    SessionConfig,
)

__all__ = ["LocalEngine", "LocalSession", "monotonic_ms"]

_MIN_INPUT_RATE_HZ = 8000
_MAX_INPUT_RATE_HZ = 48000


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class LocalSession(DuplexSession):
    """A handle on one embedded-engine session."""

    def __init__(self, engine: LocalEngine, core: LocalSessionCore) -> None:
        self._engine = engine
        self._core = core
        self.session_id = core.session_id
        self.capabilities: Capabilities = core.capabilities
        self._stream = EventStream(core.session_id)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_deadline_ms: int | None = None
        self._closed_event = asyncio.Event()

    @property
    def closed(self) -> bool:
        return self._core.state is SessionState.CLOSED

    @property
    def lease_generation(self) -> int:
        return self._core.lease_generation

    @property
    def epoch(self) -> int:
        return self._core.epoch

    @property
    def model(self) -> str:
        """The name the session object gives a session whose client named no model: the agent serving it."""
        return f"callbridge/{self._core.options.agent}"

    def turn_facts(self) -> dict[str, object]:
        return self._core.turn_facts()

    @property
    def idle_timeout_s(self) -> float | None:
        ttl_ms = self._core.options.idle_ttl_ms
        return None if ttl_ms is None else ttl_ms / 1000

    async def submit(self, command: EngineCommand) -> None:
        self._core.submit(command, self._engine.clock())
        self._pump()

    def take_ready_events(self) -> list[EngineEvent]:
        return self._stream.take_ready()

    def events(self) -> AsyncIterator[EngineEvent]:
        """Events kept while detached come after resume; a closed session's events drain."""
        return self._stream.iterate()

    async def detach(self) -> ResumeTicket:
        self._start_grace()
        self._stream.pause()
        return self.resume_ticket()

    def _start_grace(self) -> None:
        """The lease half of ``detach``: the engine's disconnect grace starts, events keep flowing."""
        self._core.detach(self._engine.clock())
        self._pump()

    def resume_ticket(self) -> ResumeTicket:
        return ResumeTicket(self.session_id, lease_generation=self._core.lease_generation)

    async def close(self, reason: str = "client_close") -> None:
        if not self.closed:
            await self.submit(CloseSession(reason))
        await self._closed_event.wait()

    def _reattach(self, expected_generation: int) -> None:
        self._core.resume(expected_generation, self._engine.clock())
        # session.resumed comes first, then what was kept while detached (as a wire replay does).
        self._stream.put_first(self._core.events_to_send())
        self._stream.unpause()
        self._pump()

    def _pump(self) -> None:
        """Move the core's events to the queue and re-arm the timer if the core's deadline moved."""
        for event in self._core.events_to_send():
            self._stream.put(event)
        deadline = None if self.closed else self._core.next_deadline_ms()
        if deadline != self._timer_deadline_ms:  # most commands leave it where it was: no timer churn per frame
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._timer_deadline_ms = deadline
            if deadline is not None:
                delay_s = max(0, deadline - self._engine.clock()) / 1000
                self._timer = asyncio.get_running_loop().call_later(delay_s, self._on_timer)
        if self.closed:
            self._stream.finish()
            self._closed_event.set()
            self._engine._forget(self)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_deadline_ms = None
        self._core.tick(self._engine.clock())
        self._pump()


class LocalEngine(DuplexEngine):
    """The embedded engine: agents on the CPU, vllm-omni's session semantics."""

    def __init__(
        self,
        options: LocalEngineOptions | None = None,
        *,
        clock: Callable[[], int] = monotonic_ms,
        scorer_factory: Callable[[], FrameScorer] | None = None,
    ) -> None:
        self.options = options or LocalEngineOptions()
        if self.options.agent not in AGENTS:
            raise ValueError(f"unknown agent {self.options.agent!r}; choose from {sorted(AGENTS)}")
        self.clock = clock
        self._scorer_factory = scorer_factory
        self._sessions: dict[str, LocalSession] = {}

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    async def warm_up(self) -> None:
        """Silero loads in a worker thread (about 50-200 ms of CPU): before, the first session loaded it on the
        event loop, a gap in every call's audio at that moment (seen as the first SIP call's RTP gap)."""
        if self._scorer_factory is None:  # a session with turn detection scores with the shared Silero model
            await asyncio.to_thread(warm_up_silero)

    def get_session(self, session_id: str) -> LocalSession | None:
        return self._sessions.get(session_id)

    async def open(self, config: SessionConfig) -> LocalSession:
        if len(self._sessions) >= self.options.max_sessions:
            raise EngineError(
                ErrorCode.RESOURCE_EXHAUSTED, f"duplex_session_capacity_exhausted: limit={self.options.max_sessions}"
            )
        if not _MIN_INPUT_RATE_HZ <= config.input_rate_hz <= _MAX_INPUT_RATE_HZ:
            raise EngineError(ErrorCode.UNSUPPORTED_AUDIO_FORMAT, f"input rate {config.input_rate_hz} Hz")
        if "audio" not in config.modalities:
            raise EngineError(ErrorCode.INVALID_SESSION_CONFIG, "the embedded engine speaks: modalities need audio")
        session_id = f"duplex-{secrets.token_hex(16)}"
        scorer = self._scorer_factory() if self._scorer_factory and config.turn_detection else None
        core = LocalSessionCore(
            session_id, config, AGENTS[self.options.agent](), self.options, self.clock(), scorer=scorer
        )
        session = LocalSession(self, core)
        self._sessions[session_id] = session
        session._pump()
        return session

    async def resume(self, ticket: ResumeTicket) -> LocalSession:
        session = self._sessions.get(ticket.session_id)
        if session is None:
            raise EngineError(
                ErrorCode.SESSION_RESUME_EXPIRED, f"unknown or expired session {ticket.session_id}", session_id=ticket.session_id
            )
        session._reattach(ticket.lease_generation)
        return session

    async def detach_session(self, session_id: str, expected_generation: int | None = None) -> None:
        """Start a session's disconnect grace, fenced on its lease generation (as ``DuplexOmni.detach_session``).

        Unlike ``LocalSession.detach`` this leaves the current ``events()`` iteration running: a transport
        (the engine server) keeps journaling the session's events for the next connection.
        """
        session = self._sessions.get(session_id)
        if session is None:
            raise EngineError(ErrorCode.UNKNOWN_SESSION, session_id)
        if expected_generation is not None and expected_generation != session.lease_generation:
            raise EngineError(ErrorCode.SESSION_RESUME_CONFLICT, "lease generation moved on", session_id=session_id)
        session._start_grace()

    async def aclose(self) -> None:
        for session in list(self._sessions.values()):
            await session.close("shutdown")

    def _forget(self, session: LocalSession) -> None:
        self._sessions.pop(session.session_id, None)
