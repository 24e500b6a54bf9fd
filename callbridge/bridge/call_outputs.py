"""What a call stream (``CallSession``) hands its driver, in the order it produced it (``CallSession.outputs()``),
and its account of itself as it ends (``StreamReport``). The driver does each output in turn: a message for the
carrier, a command for the engine session, carrier work the agent asked for, the hang-up, the socket's close, the
engine to bind, and what the call saw for the log, the metrics and the application's events."""

from __future__ import annotations

from dataclasses import dataclass

from callbridge.bridge.actions import ApplicationToolCall, CarrierCallAction
from callbridge.bridge.end_reason import EndCause
from callbridge.bridge.lifecycle import StreamFacts
from callbridge.carriers.base import (
    CarrierNotice,
    DtmfReceived,
    RemoteProtocolError,
    StreamStarted,
    UnknownCarrierEvent,
)
from callbridge.engine.commands import EngineCommand

__all__ = [
    "BargeInFlushed",
    "BindEngine",
    "CallOutput",
    "CallerAudioBegan",
    "ClockDistrusted",
    "CloseTransport",
    "HangUpCall",
    "MarkLag",
    "Notice",
    "Observed",
    "PendingAction",
    "Perform",
    "RecordingChunk",
    "StreamReport",
    "ToCarrier",
    "ToEngine",
]


@dataclass(frozen=True, slots=True)
class ToCarrier:
    """A message for the carrier's connection."""

    message: str | bytes


@dataclass(frozen=True, slots=True)
class ToEngine:
    """A command for the call's engine session (dropped when there is none)."""

    command: EngineCommand


@dataclass(frozen=True, slots=True)
class HangUpCall:
    """End the phone call through the carrier's REST API (``HangUpMode.REST``), once."""

    reason: str


@dataclass(frozen=True, slots=True)
class CloseTransport:
    """Close the carrier's connection with ``code`` (once); nothing is sent after it."""

    code: int


@dataclass(frozen=True, slots=True)
class Notice:
    """The carrier reported something that changes nothing (for the log), sent an event type nobody here knows
    (for the log, once per type, and the count), or a digit the caller pressed (for the log and the count, whatever
    the model is told of it)."""

    notice: CarrierNotice | UnknownCarrierEvent | DtmfReceived


@dataclass(frozen=True, slots=True)
class ClockDistrusted:
    """The stream's media timestamps run ahead of the wall clock (``InboundAudio.timestamps_distrusted``): its gaps
    are not filled from them any more (for the log, once)."""

    detail: str


@dataclass(frozen=True, slots=True)
class MarkLag:
    """A marker's echo came this long after the playback model expected it (for the metrics)."""

    ms: int


@dataclass(frozen=True, slots=True)
class Observed:
    """What the call core saw of the conversation, for the application's events and the end-of-call report:
    ``turn`` (``ms``: the caller stopped speaking → the agent's reply on its way to the caller), ``barge-in``
    (``ms`` of the reply ``response_id`` the caller heard, of ``of_ms`` generated), ``dtmf`` (``detail``)."""

    kind: str
    ms: int = 0
    of_ms: int | None = None
    response_id: str | None = None
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class RecordingChunk:
    """The call's recording up to now (``StereoRecorder``): interleaved stereo PCM16 for the file, about half a
    second of it."""

    data: bytes


@dataclass(frozen=True, slots=True)
class BargeInFlushed:
    """The carrier's playback was flushed (its clear is queued before this): the barge-in's reaction is done."""

    response_id: str | None


@dataclass(frozen=True, slots=True)
class BindEngine:
    """The carrier's ``start`` was accepted: find the stream's engine session (``CallLifecycle``), then
    ``engine_bound`` — or ``no_engine`` / ``start_refused``. Meanwhile the caller's audio is buffered."""

    start: StreamStarted


@dataclass(frozen=True, slots=True)
class CallerAudioBegan:
    """The stream's first caller audio was read (the driver times its way to the engine from here)."""


@dataclass(frozen=True, slots=True)
class StreamReport:
    """A stream's account of itself as it ends (``CallSession.report()``): for the log and the metrics."""

    facts: StreamFacts
    """``facts.call_over``: the call is over (else the stream left its session for the next one)."""
    limit_reached: str | None
    engine_failure: EndCause | None
    """Why the engine failed the call, if it did."""
    failure: RemoteProtocolError | None
    """The carrier's protocol error that ended the stream, if one did."""
    stream_input_ms: int
    output_ms: int
    frames_sent: int
    frames_flushed: int
    barge_ins: int
    late_deltas_dropped: int
    heard_corrections: int
    playout_underruns: int
    barge_in_pauses: int = 0
    """Bridge-mode barge-in: the agent paused for the caller's speech (``AgentSpeech.pauses``)."""
    barge_in_resumes: int = 0
    barge_in_echo_ms: int = 0
    """Bridge-mode barge-in: the caller's line that was only the agent's own echo (``AgentSpeech.echo_ms``)."""
    first_agent_audio_ms: int | None = None
    """The bind → the first audio sent to the caller (``AgentSpeech.first_audio_after_ms``)."""
    media_until_ms: int | None = None
    """Where the caller's media ended, on the driver's monotonic clock (its first payload's time plus the media it
    carried): when the call ended as the carrier's audio says, whenever its end was read (a hang-up webhook
    processed late). None: no media came."""


@dataclass(frozen=True, slots=True)
class PendingAction:
    """Carrier work the agent asked for: the driver performs it, then calls ``action_finished(call_id, …)``."""

    call_id: str
    """The model's function call id (the output answers it)."""
    action: CarrierCallAction | ApplicationToolCall


@dataclass(frozen=True, slots=True)
class Perform:
    """Carrier work the agent asked for (a transfer, DTMF): do it, then ``CallSession.action_finished``."""

    pending: PendingAction


CallOutput = (
    ToCarrier | ToEngine | Perform | HangUpCall | CloseTransport | BindEngine | CallerAudioBegan | Notice | MarkLag | BargeInFlushed
    | Observed | RecordingChunk | ClockDistrusted
)
"""What ``CallSession.outputs()`` hands the driver, in the order the call produced it."""
