"""What a duplex session tells the bridge, one class per event (vllm-omni 0.30.0 §1.3).

Only the events the bridge acts on are typed; an engine drops the rest (the
wire client logs them at debug level). ``EngineEvent`` is the union that
``DuplexSession.events()`` yields; ``TERMINAL_EVENTS`` end that stream.
Audio is PCM16 little-endian mono at ``rate_hz`` (24 kHz for MiniCPM-o and
Qwen3-Omni). Times are ms from the start of the response (``*_ms`` on audio)
or of the session's input audio (speech events).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

__all__ = [
    "TERMINAL_EVENTS",
    "AudioDelta",
    "Capabilities",
    "EngineErrorEvent",
    "EngineEvent",
    "FunctionCall",
    "HeartbeatAck",
    "InputCleared",
    "InputCommitted",
    "InputTranscript",
    "ItemCreated",
    "ItemTruncated",
    "is_chunk_verdict",
    "OutputAudioCleared",
    "OverlapDecision",
    "PlaybackAcknowledged",
    "ResponseCreated",
    "ResponseDone",
    "ResponseListen",
    "SessionClosed",
    "SessionCreated",
    "SessionExpired",
    "SessionReplaced",
    "SessionResumed",
    "SpeechStarted",
    "SpeechStopped",
    "TranscriptDelta",
]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the engine announces in ``session.created`` (``session.capabilities``)."""

    supports_barge_in: bool = False
    supports_session_resume: bool = False
    supports_audio_truncate: bool = False
    supports_playback_ack: bool = False
    chunk_period_ms: int = 1000
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_wire(cls, caps: dict[str, Any]) -> Capabilities:
        period = caps.get("chunk_period_ms", 1000)
        return cls(
            supports_barge_in=bool(caps.get("supports_barge_in", False)),
            supports_session_resume=bool(caps.get("supports_session_resume", False)),
            supports_audio_truncate=bool(caps.get("supports_audio_truncate", False)),
            supports_playback_ack=bool(caps.get("supports_playback_ack", False)),
            chunk_period_ms=int(period) if isinstance(period, int | float) and not isinstance(period, bool) else 1000,
            raw=dict(caps),
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            **self.raw,
            "supports_barge_in": self.supports_barge_in,
            "supports_session_resume": self.supports_session_resume,
            "supports_audio_truncate": self.supports_audio_truncate,
            "supports_playback_ack": self.supports_playback_ack,
            "chunk_period_ms": self.chunk_period_ms,
        }


@dataclass(frozen=True, slots=True)
class SessionCreated:
    session_id: str
    capabilities: Capabilities
    resume_token: str | None = None
    attachment_generation: int | None = None


@dataclass(frozen=True, slots=True)
class SessionResumed:
    session_id: str
    resume_token: str | None = None
    attachment_generation: int | None = None
    capabilities: Capabilities | None = None
    """What the resumed session can do (``session.resumed`` carries the session object), when known."""


@dataclass(frozen=True, slots=True)
class SessionClosed:
    """The session ended (terminal). ``reason``: ``client_close``, ``disconnect``, ``transport_error``…"""

    session_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SessionExpired:
    """The engine expired the session (terminal): ``disconnect_grace_expired`` or ``idle_ttl_expired``."""

    session_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class SessionReplaced:
    """Another connection took this session over (terminal for this one)."""

    session_id: str


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    audio_start_ms: int
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    audio_end_ms: int
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class InputCommitted:
    item_id: str | None = None


@dataclass(frozen=True, slots=True)
class InputTranscript:
    """What the caller said in an input item, as the model transcribed it
    (``conversation.item.input_audio_transcription.completed``; vllm-omni 0.30 sends it where the model's plugin
    surfaces its ASR text, as AURA-Omni's does; Qwen3-Omni's does not)."""

    item_id: str | None
    transcript: str


@dataclass(frozen=True, slots=True)
class InputCleared:
    """The input buffer was cleared (``input_audio_buffer.clear``)."""


@dataclass(frozen=True, slots=True)
class ResponseCreated:
    response_id: str
    epoch: int | None = None


@dataclass(frozen=True, slots=True)
class ResponseDone:
    """``status``: ``completed``, ``cancelled``, ``failed``…; ``reason`` from ``status_details`` when cancelled
    (``barge_in``, ``turn_detected``, ``client_cancelled``)."""

    response_id: str
    status: str
    reason: str | None = None
    epoch: int | None = None


@dataclass(frozen=True, slots=True)
class AudioDelta:
    pcm: bytes = field(repr=False)
    rate_hz: int
    response_id: str
    item_id: str
    epoch: int | None = None


@dataclass(frozen=True, slots=True)
class TranscriptDelta:
    response_id: str
    delta: str


@dataclass(frozen=True, slots=True)
class OutputAudioCleared:
    response_id: str | None


@dataclass(frozen=True, slots=True)
class OverlapDecision:
    """The engine's verdict on each input chunk during a response: ``barge_in``, ``listen`` or ``drop``.

    ``duration_ms``: the chunk's length (0 when the verdict came from the wire without it);
    ``overlap_speech_ms``: the caller's speech over this response so far; ``policy``: the session's overlap
    policy, ``barge_in_on_speech`` under server VAD, ``listen_only`` when the client commits turns."""

    action: str
    reason: str | None = None
    epoch: int | None = None
    duration_ms: int = 0
    overlap_speech_ms: int = 0
    policy: str = "barge_in_on_speech"


@dataclass(frozen=True, slots=True)
class ResponseListen:
    """An input chunk taken as silence or noise while no response is in progress: nothing will answer it.

    vllm-omni's runner says so for each such chunk of a turn model (``response.listen``); the bridge acts
    on none of them."""

    reason: str
    epoch: int | None = None


@dataclass(frozen=True, slots=True)
class PlaybackAcknowledged:
    response_id: str | None
    played_ms: int


@dataclass(frozen=True, slots=True)
class ItemCreated:
    """A client item (a user text message, a function call's output) joined the conversation.

    ``item`` is the conversation item as the Realtime protocol writes it (``id``, ``type``, ``status`` …);
    the bridge acts on nothing here, the engine server announces it (``conversation.item.added`` …)."""

    item: dict[str, Any] = field(hash=False, compare=False)
    item_id: str = ""


@dataclass(frozen=True, slots=True)
class ItemTruncated:
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class FunctionCall:
    """The model calls a tool the session declared (``SessionConfig.tools``): vllm-omni 0.30 ends a response
    with one ``function_call`` output item (``response.output_item.done``). Answer with ``FunctionCallOutput``
    and the same ``call_id``. ``arguments`` is the decoded JSON object; arguments that are not a JSON object
    decode to ``{}`` and keep their text in ``raw_arguments`` (the model's mistake, not a protocol fault)."""

    name: str
    call_id: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str = ""
    response_id: str | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatAck:
    pass


@dataclass(frozen=True, slots=True)
class EngineErrorEvent:
    """A command failed; the session goes on."""

    code: str
    message: str
    retryable: bool = False
    event_id: str | None = None


EngineEvent = (
    SessionCreated
    | SessionResumed
    | SessionClosed
    | SessionExpired
    | SessionReplaced
    | SpeechStarted
    | SpeechStopped
    | InputCommitted
    | InputTranscript
    | InputCleared
    | ResponseCreated
    | ResponseDone
    | AudioDelta
    | TranscriptDelta
    | OutputAudioCleared
    | OverlapDecision
    | ResponseListen
    | PlaybackAcknowledged
    | ItemCreated
    | ItemTruncated
    | FunctionCall
    | HeartbeatAck
    | EngineErrorEvent
)

def is_chunk_verdict(event: EngineEvent) -> bool:
    """The engine's answer to one input chunk that changes nothing: ``response.listen`` while idle, an
    ``overlap.decision`` to ``drop`` or ``listen`` during a reply. One per chunk; only a ``barge_in`` is acted on."""
    return isinstance(event, ResponseListen) or (isinstance(event, OverlapDecision) and event.action != "barge_in")


TERMINAL_EVENTS: Final = (SessionClosed, SessionExpired, SessionReplaced)
