"""The port the bridge codes against: open, resume, detach and close duplex sessions.

Shaped on vllm-omni's ``DuplexOmni`` / ``DuplexSessionHandle`` (reference
§3.2): an engine opens a session from a ``SessionConfig``; the session takes
typed commands (``submit`` and its wrappers) and yields typed events from one
ordered stream (``events()``, one consumer at a time). Three engines implement
it: the vllm-omni wire client (``realtime``), the in-process adapter
(``inline``) and the embedded CPU engine (``local``).

Life of a session, as the bridge sees it::

    open ──► live ──detach()──► detached ──engine.resume(ticket)──► live …
               │                    │
               └──close()──► closed └──grace passes──► expired (session.expired)

``detach()`` ends the current ``events()`` iteration and starts the engine's
disconnect grace; the ``ResumeTicket`` it returns (also ``resume_ticket()``)
is plain data, so another bridge process can resume the session from a
registry. Events produced while detached are kept and delivered after resume.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from callbridge.engine.commands import (
    AckPlayback,
    AppendAudio,
    BargeIn,
    CancelResponse,
    ClearInput,
    ClearOutputAudio,
    Commit,
    CreateResponse,
    CreateTextItem,
    EngineCommand,
    Heartbeat,
    TruncateItem,
)
from callbridge.engine.errors import EngineError, ErrorCode
from callbridge.engine.events import Capabilities, EngineEvent

__all__ = ["DuplexEngine", "DuplexSession", "ResumeTicket", "SessionConfig", "TurnDetection", "UnheardAudio"]


@dataclass(frozen=True, slots=True)
class TurnDetection:
    """vllm-omni's ``server_vad`` parameters (reference §5.3); the engine detects turns and barge-in."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    min_speech_duration_ms: int = 96
    create_response: bool = True

    def to_wire(self) -> dict[str, Any]:
        return {
            "type": "server_vad",
            "threshold": self.threshold,
            "prefix_padding_ms": self.prefix_padding_ms,
            "silence_duration_ms": self.silence_duration_ms,
            "min_speech_duration_ms": self.min_speech_duration_ms,
            "create_response": self.create_response,
            "interrupt_response": True,  # vllm-omni rejects false (unsupported_turn_detection)
        }

    @classmethod
    def from_wire(cls, payload: Mapping[str, Any]) -> TurnDetection:
        """Parse a ``turn_detection`` object; raises ``EngineError(unsupported_turn_detection)``."""
        known = {"type", "threshold", "prefix_padding_ms", "silence_duration_ms", "min_speech_duration_ms"}
        known |= {"create_response", "interrupt_response"}
        unknown = set(payload) - known
        if payload.get("type", "server_vad") != "server_vad" or unknown:
            raise EngineError(ErrorCode.UNSUPPORTED_TURN_DETECTION, f"unsupported turn_detection {dict(payload)!r}")
        if payload.get("interrupt_response", True) is not True:
            raise EngineError(ErrorCode.UNSUPPORTED_TURN_DETECTION, "interrupt_response must be true")
        try:
            detection = cls(
                threshold=float(payload.get("threshold", 0.5)),
                prefix_padding_ms=int(payload.get("prefix_padding_ms", 300)),
                silence_duration_ms=int(payload.get("silence_duration_ms", 500)),
                min_speech_duration_ms=int(payload.get("min_speech_duration_ms", 96)),
                create_response=bool(payload.get("create_response", True)),
            )
        except (TypeError, ValueError) as exc:
            raise EngineError(ErrorCode.UNSUPPORTED_TURN_DETECTION, str(exc)) from exc
        if not 0 < detection.threshold < 1 or min(detection.silence_duration_ms, detection.prefix_padding_ms) < 0:
            raise EngineError(ErrorCode.UNSUPPORTED_TURN_DETECTION, f"out of range: {detection}")
        return detection


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """How to open a session. Audio in is PCM16 at ``input_rate_hz``; audio out is PCM16 at the
    model's rate (events carry it). ``turn_detection`` None: the bridge commits turns itself."""

    model: str | None = None
    modalities: tuple[str, ...] = ("audio", "text")
    instructions: str | None = None
    voice: str | None = None
    ref_audio: str | None = None
    temperature: float | None = None
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    input_rate_hz: int = 16000
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    tools: tuple[Mapping[str, Any], ...] = ()
    """Functions the model may call (Realtime ``{"type": "function", "name", "description", "parameters"}``);
    its calls come back as ``FunctionCall`` events."""
    tool_choice: str = "auto"

    def to_realtime(self) -> dict[str, Any]:
        """The Realtime ``session`` object for ``session.update`` (reference §2.1, §10), rate declared
        explicitly: vllm-omni assumes 16 kHz otherwise (the 8 kHz gotcha)."""
        session: dict[str, Any] = {
            "modalities": list(self.modalities),
            "input_audio_format": "pcm16",
            "output_audio_format": "pcm16",
            "sample_rate_hz": self.input_rate_hz,
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": self.input_rate_hz}}},
            "turn_detection": self.turn_detection.to_wire() if self.turn_detection else None,
        }
        for key in ("model", "instructions", "voice", "ref_audio", "temperature"):
            value = getattr(self, key)
            if value is not None:
                session[key] = value
        if self.extra_body:
            session["extra_body"] = dict(self.extra_body)
        if self.tools:
            session["tools"] = [dict(tool) for tool in self.tools]
            session["tool_choice"] = self.tool_choice
        return session


@dataclass(frozen=True, slots=True)
class UnheardAudio:
    """The bridge's note: the rest of the reply that was playing when a stream ended, as the carrier would have
    played it (its encoding, rate and frames), for the call's next stream to play from where the caller stopped
    hearing it. Kept in the carrier's encoding (μ-law: 8 kB a second), base64 in ``audio``, at most
    ``UNHEARD_KEPT_BYTES``."""

    response_id: str
    encoding: str
    rate_hz: int
    frame_ms: int
    audio: str
    ended: bool
    """The engine had finished the reply: nothing more of it comes after this audio."""
    generated_ms: int
    """How much of the engine's audio the frames hold (their last frame is padded to a whole one)."""

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UnheardAudio:
        return cls(
            response_id=str(data["response_id"]),
            encoding=str(data["encoding"]),
            rate_hz=int(data["rate_hz"]),
            frame_ms=int(data["frame_ms"]),
            audio=str(data["audio"]),
            ended=bool(data["ended"]),
            generated_ms=int(data["generated_ms"]),
        )


UNHEARD_KEPT_BYTES: Final = 256 * 1024
"""The most audio a ticket carries (32 s of μ-law; a longer rest is not carried: the model is told what was heard)."""


@dataclass(frozen=True, slots=True)
class ResumeTicket:
    """Everything needed to resume a detached session, from this process or another.

    ``lease_generation`` fences in-process resumes (compare-and-swap); the wire
    client resumes with ``resume_token`` and ``last_event_seq`` at ``endpoint``.
    """

    session_id: str
    lease_generation: int = 0
    resume_token: str | None = None
    last_event_seq: int = 0
    endpoint: str | None = None
    heard_ms: tuple[tuple[str, int], ...] = ()
    """The bridge's note, not the engine's: (response id, ms the caller heard of it) for the replies a stream cut
    off as it ended while the engine was still generating them. The next stream plays the rest of each and counts
    what it tells the engine of it on from there, never lower."""
    told_ms: tuple[tuple[str, int], ...] = ()
    """The bridge's note: (response id, the most the engine was told the caller heard of it) for the newest
    responses: a stream that takes the call over from this ticket tells the engine no less of any of them."""
    at_answer: bool = False
    """The bridge's note: parked by the call's answer webhook (opened there, never streamed yet), not by a stream."""
    unheard: UnheardAudio | None = None
    """The bridge's note: the rest of the reply the stream was playing as it ended, for the next stream to play."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ResumeTicket:
        return cls(
            session_id=str(data["session_id"]),
            lease_generation=int(data.get("lease_generation", 0)),
            resume_token=data.get("resume_token"),
            last_event_seq=int(data.get("last_event_seq", 0)),
            endpoint=data.get("endpoint"),
            heard_ms=_per_response(data.get("heard_ms", ())),
            told_ms=_per_response(data.get("told_ms", ())),
            at_answer=bool(data.get("at_answer", False)),
            unheard=UnheardAudio.from_dict(data["unheard"]) if data.get("unheard") else None,
        )


def _per_response(pairs: Iterable[Any]) -> tuple[tuple[str, int], ...]:
    """(response id, ms) pairs as a ticket's JSON holds them (lists), typed."""
    return tuple((str(response_id), int(ms)) for response_id, ms in pairs)


class DuplexSession(abc.ABC):
    """One duplex session bound to a call. Commands go in through ``submit`` (or the wrappers);
    events come out of ``events()``."""

    session_id: str
    capabilities: Capabilities

    @abc.abstractmethod
    async def submit(self, command: EngineCommand) -> None:
        """Send one command, in order. Raises ``EngineError(session_closed)`` once closed; a command the
        engine rejects comes back as an ``EngineErrorEvent`` on ``events()``."""

    @abc.abstractmethod
    def events(self) -> AsyncIterator[EngineEvent]:
        """The session's events, in order. One consumer at a time; ends after a terminal event
        (``TERMINAL_EVENTS``) or when the session is detached."""

    def take_ready_events(self) -> list[EngineEvent]:
        """Events already queued, taken now instead of through ``events()`` (which then skips them): the
        bridge handles what a command caused in the same turn of the loop. Empty by default, and whenever
        nothing is queued; never while the consumer of ``events()`` holds an event it has not handled."""
        return []

    @abc.abstractmethod
    async def detach(self) -> ResumeTicket:
        """Leave the session to the engine for its disconnect grace; returns what resumes it."""

    @abc.abstractmethod
    def resume_ticket(self) -> ResumeTicket:
        """The current resume state (changes as events arrive and tokens rotate)."""

    def limit_acks(self, through_seq: int | None) -> None:
        """Acknowledge the server's events no further than ``through_seq`` (None: no limit, the default): a ticket
        written elsewhere at that event (the registry's live ticket) must stay resumable, and the server drops
        from its replay journal what is acknowledged. Nothing for a session that acknowledges nothing."""

    @property
    @abc.abstractmethod
    def closed(self) -> bool:
        """True once the session has ended (closed, expired or replaced)."""

    @abc.abstractmethod
    async def close(self, reason: str = "client_close") -> None:
        """End the session; returns once the engine has closed it. Idempotent."""

    async def append_audio(self, pcm: bytes, rate_hz: int) -> None:
        await self.submit(AppendAudio(pcm, rate_hz))

    async def commit(self, create_response: bool | None = None) -> None:
        await self.submit(Commit(create_response))

    async def create_response(self) -> None:
        await self.submit(CreateResponse())

    async def cancel_response(self, response_id: str | None = None) -> None:
        await self.submit(CancelResponse(response_id))

    async def barge_in(self) -> None:
        await self.submit(BargeIn())

    async def clear_output_audio(self, response_id: str | None = None) -> None:
        await self.submit(ClearOutputAudio(response_id))

    async def clear_input(self) -> None:
        await self.submit(ClearInput())

    async def ack_playback(self, response_id: str, played_ms: int) -> None:
        await self.submit(AckPlayback(response_id, played_ms, item_id=f"item_{response_id}"))

    async def truncate_item(self, item_id: str, audio_end_ms: int) -> None:
        await self.submit(TruncateItem(item_id, audio_end_ms))

    async def create_text_item(self, text: str) -> None:
        await self.submit(CreateTextItem(text))

    async def heartbeat(self) -> None:
        await self.submit(Heartbeat())


class DuplexEngine(abc.ABC):
    """Opens and resumes duplex sessions."""

    @abc.abstractmethod
    async def open(self, config: SessionConfig) -> DuplexSession:
        """Open a session. Raises ``EngineError`` (``resource_exhausted`` is retryable)."""

    @abc.abstractmethod
    async def resume(self, ticket: ResumeTicket) -> DuplexSession:
        """Resume a detached session. Raises ``EngineError`` with a code in ``FATAL_RESUME_CODES`` when it
        cannot ever succeed."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Close every session this engine holds and release its resources."""

    @property
    def session_count(self) -> int | None:
        """Sessions this engine holds in this process, where it holds them itself (the embedded engine); None
        where they live elsewhere (a vllm-omni server counts its own)."""
        return None

    async def warm_up(self) -> None:
        """Ready, off the event loop, what the first session would otherwise load on it (a model, a runtime), so
        that the first call's audio does not wait for it. Called once at start, before any call; by default
        there is nothing to ready."""


