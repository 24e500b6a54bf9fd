"""What one bridge process shares between its calls: configuration, the engine, the call registry, the
stream tokens, metrics and the carriers' REST clients."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from callbridge.bridge.call import CallOptions, DtmfMode
from callbridge.bridge.registry import CallRegistry, StreamTokens
from callbridge.config import Settings
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.port import (
    DuplexEngine,
    ResumeTicket,
    SessionConfig,
    TurnDetection,
)
from callbridge.logging import get_logger

__all__ = ["BridgeMetrics", "BridgeServices", "HangUpFn", "LiveStream", "build_engine", "call_options", "session_config"]

log = get_logger(__name__)

_ENGINE_CALL_TIMEOUT_S = 5.0

HangUpFn = Callable[[str, str, str | None, str], Awaitable[None]]
"""``hang_up(provider, call_id, account_id, reason)``: end the phone call through the carrier."""


class BridgeMetrics:
    """Prometheus metrics of one bridge process, in its own registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls_active = Gauge("callbridge_calls_active", "Calls with a live media stream", ["provider"], registry=registry)
        self.calls_total = Counter("callbridge_calls_total", "Media streams ended, by how", ["provider", "end"], registry=registry)
        self.protocol_errors = Counter(
            "callbridge_carrier_protocol_errors_total", "Calls ended by invalid carrier input", ["provider", "reason"], registry=registry
        )
        self.stream_refused = Counter("callbridge_streams_refused_total", "Media streams not bridged", ["provider", "reason"], registry=registry)
        self.engine_sessions = Counter(
            "callbridge_engine_sessions_total", "Engine sessions bound to streams", ["how"], registry=registry
        )
        self.hangups = Counter("callbridge_hangups_total", "Hang-ups through carrier REST APIs", ["provider", "result"], registry=registry)
        self.stream_status = Counter(
            "callbridge_stream_status_total", "Carrier stream status callbacks", ["provider", "event"], registry=registry
        )
        self.audio_seconds = Counter(
            "callbridge_audio_seconds_total", "Audio bridged, counted as each stream ends", ["provider", "direction"],
            registry=registry,
        )  # fmt: skip
        self.frames_flushed = Counter(
            "callbridge_frames_flushed_total", "Agent frames dropped unsent by barge-in flushes", ["provider"], registry=registry
        )
        self.barge_ins = Counter("callbridge_barge_ins_total", "Barge-in flushes", ["provider"], registry=registry)
        self.late_audio_dropped = Counter(
            "callbridge_late_audio_dropped_total", "Engine audio deltas of an interrupted response, dropped", ["provider"],
            registry=registry,
        )  # fmt: skip
        self.engine_errors = Counter("callbridge_engine_errors_total", "Engine error events, by code", ["code"], registry=registry)
        self.event_loop_lag_seconds = Histogram(
            "callbridge_event_loop_lag_seconds",
            "How late the event loop runs a timer (sampled twice a second): every call's pacing waits on it",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0),
            registry=registry,
        )
        self.engine_failures = Counter(
            "callbridge_engine_failures_total", "Calls whose engine session failed mid-call (fallback, then hang-up)",
            ["provider"], registry=registry,
        )  # fmt: skip
        self.barge_in_clear_seconds = Histogram(
            "callbridge_barge_in_clear_seconds",
            "Engine interruption signal to carrier flush sent",
            buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1),
            registry=registry,
        )


class LiveStream(Protocol):
    """A call's media stream being served by this process (``MediaStreamDriver``)."""

    async def end_by_carrier(self, reason: str) -> None:
        """The carrier said, out of band, that the call is over: end the stream as its ``stop`` would."""
        ...

    async def move_elsewhere(self) -> bool:
        """Draining: detach the engine session into the registry and close the carrier's socket without a
        goodbye, so the carrier reconnects (to another process); False where the carrier would not."""
        ...


@dataclass
class BridgeServices:
    settings: Settings
    engine: DuplexEngine
    registry: CallRegistry
    tokens: StreamTokens
    metrics: BridgeMetrics
    hang_up: HangUpFn
    draining: bool = False
    active_calls: set[str] = field(default_factory=set)
    live_streams: dict[str, LiveStream] = field(default_factory=dict)
    """call id → the stream serving it here, once bound to its engine session."""
    carrier_state: dict[str, object] = field(default_factory=dict)
    """What a carrier keeps per bridge process beside its routes (Telnyx's Call Control state), by carrier."""
    background: set[asyncio.Task[None]] = field(default_factory=set)
    """Tasks that outlive the stream that started them (closing a session nobody came back for)."""

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, held until done; cancelled at shutdown (``aclose_background``)."""
        task = asyncio.get_running_loop().create_task(work)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def aclose_background(self) -> None:
        for task in list(self.background):
            task.cancel()
        await asyncio.gather(*self.background, return_exceptions=True)

    async def call_ended_by_carrier(self, call_id: str, reason: str) -> None:
        """A carrier's webhook says the call is over (Plivo's hangup URL, Vonage ``completed``, Telnyx
        ``call.hangup``), where its media socket says nothing: the live stream ends as on a ``stop`` (the engine
        session closes, not kept for a resume), and a later stream or redirect for the call is refused."""
        stream = self.live_streams.get(call_id)
        closed = False
        if stream is not None:
            await stream.end_by_carrier(reason)
        else:  # the engine hears what a stop would tell it; the registry keeps the carrier's reason
            closed = await self.close_detached(call_id, "call_ended")
        if closed or await self.registry.ended_reason(call_id) is None:
            await self.registry.mark_ended(call_id, reason)

    async def close_detached(self, call_id: str, reason: str, ticket: ResumeTicket | None = None) -> bool:
        """Close the engine session a call left detached (waiting for its next stream) now that the call is over,
        rather than leave it to the engine's grace. With ``ticket``: only if that is still the one waiting (no
        stream has come back since). True when a session was closed."""
        waiting, _ = await self.registry.claim_ticket(call_id, ticket)
        if waiting is None:
            return False
        try:
            session = await asyncio.wait_for(self.engine.resume(waiting), _ENGINE_CALL_TIMEOUT_S)
            await asyncio.wait_for(session.close(reason), _ENGINE_CALL_TIMEOUT_S)
        except (EngineError, TimeoutError):
            return False  # expired or gone already, or the engine does not answer: its grace ends it
        await self.registry.mark_ended(call_id, reason)
        return True

    async def drain(self, timeout_s: float) -> None:
        """SIGTERM: admit no new call (``/readyz`` turns 503 with ``draining``), move every running call whose
        carrier reconnects to another process (``LiveStream.move_elsewhere``), and wait up to ``timeout_s`` for
        the others to end. Returns when no call is left here, or at the timeout."""
        self.draining = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        log.info("bridge_draining", active_calls=len(self.active_calls), timeout_s=timeout_s)
        while self.active_calls or self.live_streams:
            for stream in list(self.live_streams.values()):
                await stream.move_elsewhere()
            if loop.time() >= deadline:
                log.warning("drain_timeout", calls_left=len(self.active_calls))
                return
            await asyncio.sleep(0.05)
        log.info("bridge_drained")

    async def admits(self, call_id: str) -> bool:
        """Whether a call may be answered now: not draining, and under ``server.max_calls`` unless the call is
        already known (a stream coming back, here or from another process)."""
        if self.draining:
            return False
        if call_id in self.active_calls or len(self.active_calls) < self.settings.server.max_calls:
            return True
        return await self.registry.get(call_id) is not None


def call_options(settings: Settings) -> CallOptions:
    audio = settings.audio
    return CallOptions(
        engine_rate_hz=audio.engine_input_rate_hz,
        lead_ms=audio.playout_lead_ms,
        mark_every_frames=audio.mark_interval_frames,
        resampler_quality=audio.resampler_quality,
        dtmf_mode=DtmfMode(settings.engine.dtmf),
        failure_tone_ms=settings.engine.failure_tone_ms,
    )


def session_config(settings: Settings) -> SessionConfig:
    """The duplex session every call opens: the engine detects turns and barge-in (server VAD)."""
    engine = settings.engine
    return SessionConfig(
        model=engine.model,
        instructions=engine.instructions or None,
        voice=engine.voice,
        turn_detection=TurnDetection(),
        input_rate_hz=settings.audio.engine_input_rate_hz,
    )


def build_engine(settings: Settings) -> DuplexEngine:
    """The engine ``engine.kind`` names: embedded (default), vllm-omni over websockets, or in process."""
    kind = settings.engine.kind
    if kind == "local":
        from callbridge.engine.local.engine import LocalEngine
        from callbridge.engine.server import local_engine_options

        return LocalEngine(local_engine_options(settings))
    if kind == "realtime":
        from callbridge.engine.realtime import RealtimeEngine

        if not settings.engine.urls:
            raise EngineError(ErrorCode.INVALID_SESSION_CONFIG, "engine.kind = realtime needs engine.urls")
        key = settings.engine.api_key.get_secret_value() if settings.engine.api_key else None
        return RealtimeEngine(
            settings.engine.urls[0], api_key=key, resume_window_s=settings.engine.disconnect_grace_s
        )
    from callbridge.engine.inline import InlineEngine

    return InlineEngine.create(settings.engine.model or "")
