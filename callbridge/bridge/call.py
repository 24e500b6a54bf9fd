"""One call's stream on one duplex session, sans-I/O: the carrier's messages in, engine commands and carrier
messages out, driven by a clock passed in.

Inputs (each takes ``now_ms``): ``receive_message`` (a websocket message from
the carrier), ``engine_bound`` / ``no_engine`` / ``start_refused`` (the
driver's answer to ``BindEngine``), ``receive_engine_event``,
``engine_failed``, ``carrier_ended`` (a webhook says the call is over),
``transport_lost``, ``send_failed``, ``move_elsewhere``, ``superseded``,
``shut_down``, ``tick``.
Outputs, drained by the driver after every input: ``outputs()``, one typed
queue in the order produced (``ToCarrier``, ``ToEngine``, ``Perform``,
``HangUpCall``, ``CloseTransport``, ``BindEngine``, ``CallerAudioBegan``,
``Notice``, ``MarkLag``, ``BargeInFlushed``); sleep until
``next_deadline_ms()``. What the stream's ``CallLifecycle`` needs of it is
``facts()``; its account as it ends, ``report()``.

Audio:
- inbound: carrier payload → PCM16 (decode what ``start`` announced) → one
  stateful resampler per stream to the engine rate → ``AppendAudio``. Gaps in
  the carrier's media timestamps are filled with silence (at most a second),
  so the engine's input timeline is the carrier's media timeline; across a
  resumed stream it continues from the call's offset.
- outbound: ``AudioDelta`` → a stateful resampler per response (a response is
  an utterance; a new one starts clean) → encode → exact frames →
  ``PlayoutLedger`` (paced, bounded lead, markers). ``response.done`` drains
  the resampler and pads the last frame.
- heard position: marker echoes become ``AckPlayback``, sent at once, so they
  always precede the next input commit.
- barge-in (``overlap.decision`` barge_in, a cancelled ``response.done``,
  ``output_audio_buffer.cleared``): flush the ledger (the carrier's clear),
  ack what was heard, truncate the model's turn to it — clamped to
  [0, sent], skipped before the first frame played — and drop that
  response's late audio and any of an older epoch.

Agent actions (``bridge/actions.py``): a ``FunctionCall`` is checked against
the policy; ``end_call`` answers ``{"ok":true}`` and hangs up once the
agent's audio has played; ``transfer_call`` / ``send_dtmf`` go out through
``Perform`` outputs (the driver asks the carrier) and come back through
``action_finished``; every result goes to the model as a
``FunctionCallOutput``. A transfer that succeeded ends the call.

A carrier message that breaks the protocol ends the call: the error is kept
in ``failure`` for the driver to log, the engine session is closed, the
call hung up, the socket closed. Nothing here touches another call.
"""

from __future__ import annotations

import base64
import enum
from dataclasses import dataclass
from typing import Final

import numpy as np

from callbridge.bridge.actions import (
    ActionResult,
    ApplicationToolCall,
    CarrierCallAction,
    EndCall,
    TransferCall,
    parse_call,
)
from callbridge.bridge.heard import HeardAccount
from callbridge.bridge.inbound import CallerAudio, InboundAudio, MediaAhead, MessageBucket
from callbridge.bridge.lifecycle import EndReason, StreamFacts
from callbridge.bridge.limits import IDLE_TIMEOUT, StreamLimits
from callbridge.bridge.playout import PlayoutLedger
from callbridge.bridge.recording import StereoRecorder
from callbridge.carriers.base import (
    DEFAULT_PROFILE,
    CarrierEvent,
    CarrierNotice,
    CarrierProfile,
    DtmfReceived,
    HangUp,
    HangUpMode,
    MarkEchoed,
    MediaReceived,
    PlaybackCleared,
    ProtocolErrorReason,
    ProviderCodec,
    RemoteProtocolError,
    StreamConnected,
    StreamStarted,
    StreamStopped,
    UnknownCarrierEvent,
)
from callbridge.codecs import (
    PCM16_SAMPLE_BYTES,
    AudioEncoding,
    FrameAssembler,
    ResamplerQuality,
    StreamResampler,
    encode_from_pcm16,
)
from callbridge.engine.commands import (
    AppendAudio,
    CloseSession,
    CreateResponse,
    CreateTextItem,
    EngineCommand,
    FunctionCallOutput,
)
from callbridge.engine.errors import FATAL_RESUME_CODES, ErrorCode
from callbridge.engine.events import (
    AudioDelta,
    Capabilities,
    EngineEvent,
    FunctionCall,
    ItemTruncated,
    OutputAudioCleared,
    OverlapDecision,
    PlaybackAcknowledged,
    ResponseDone,
    SessionClosed,
    SessionExpired,
    SessionReplaced,
    SpeechStarted,
    SpeechStopped,
)
from callbridge.engine.late_audio import LateAudioFilter
from callbridge.engine.port import UNHEARD_KEPT_BYTES, UnheardAudio

__all__ = [
    "TRANSITIONS",
    "BargeInFlushed",
    "BindEngine",
    "Observed",
    "RecordingChunk",
    "SilencePolicy",
    "CallOptions",
    "CallOutput",
    "CallSession",
    "CallState",
    "CallStateError",
    "CallerAudioBegan",
    "CloseTransport",
    "DtmfMode",
    "FIRST_MARK_FRAMES",
    "HangUpCall",
    "MarkLag",
    "Notice",
    "PendingAction",
    "Perform",
    "StreamReport",
    "ToCarrier",
    "ToEngine",
    "engine_failure_kind",
]


FIRST_MARK_FRAMES: Final = 5
"""A response's first marker goes this many 20 ms frames in: its echo pins where the carrier started playing the
response (the network's and the carrier's delay), so the heard position is exact from then on; later markers, every
``mark_every_frames``, only correct it for drift."""


class CallState(enum.Enum):
    AWAITING_START = "awaiting_start"
    STARTING = "starting"
    """``start`` received; the engine session is being opened or resumed."""
    LIVE = "live"
    DETACHED = "detached"
    """The socket dropped without ``stop``: the engine session waits for the next stream."""
    ENDING = "ending"
    """The engine failed mid-call: the caller hears the fallback tone, then the call is hung up."""
    ENDED = "ended"


class _Trigger(enum.Enum):
    CONNECTED = "connected"
    STARTED = "started"
    ENGINE_BOUND = "engine_bound"
    START_REFUSED = "start_refused"
    CARRIER_EVENT = "carrier_event"
    STOPPED = "stopped"
    ENGINE_ENDED = "engine_ended"
    ENGINE_FAILED = "engine_failed"
    FALLBACK_PLAYED = "fallback_played"
    TRANSPORT_LOST = "transport_lost"
    FAILED = "failed"
    AGENT_ENDED = "agent_ended"
    """The agent hung up (``end_call``) or transferred the call."""
    REPLACED = "replaced"
    """Another stream took the engine session over (``session.replaced``): the call goes on there."""


_S, _T = CallState, _Trigger
TRANSITIONS: Final[dict[tuple[CallState, _Trigger], CallState]] = {
    (_S.AWAITING_START, _T.CONNECTED): _S.AWAITING_START,
    (_S.AWAITING_START, _T.STARTED): _S.STARTING,
    (_S.AWAITING_START, _T.TRANSPORT_LOST): _S.ENDED,
    (_S.AWAITING_START, _T.FAILED): _S.ENDED,
    (_S.STARTING, _T.ENGINE_BOUND): _S.LIVE,
    (_S.STARTING, _T.START_REFUSED): _S.ENDED,
    (_S.STARTING, _T.CARRIER_EVENT): _S.STARTING,
    (_S.STARTING, _T.STOPPED): _S.ENDED,
    (_S.STARTING, _T.TRANSPORT_LOST): _S.DETACHED,  # not the call's end: the carrier may reconnect
    (_S.STARTING, _T.FAILED): _S.ENDED,
    (_S.STARTING, _T.ENGINE_FAILED): _S.ENDING,
    (_S.LIVE, _T.CARRIER_EVENT): _S.LIVE,
    (_S.LIVE, _T.STOPPED): _S.ENDED,
    (_S.LIVE, _T.ENGINE_ENDED): _S.ENDED,
    (_S.LIVE, _T.TRANSPORT_LOST): _S.DETACHED,
    (_S.LIVE, _T.FAILED): _S.ENDED,
    (_S.LIVE, _T.ENGINE_FAILED): _S.ENDING,
    (_S.LIVE, _T.AGENT_ENDED): _S.ENDED,
    (_S.LIVE, _T.REPLACED): _S.DETACHED,  # not the call's end: its newer stream has the session
    (_S.ENDING, _T.CARRIER_EVENT): _S.ENDING,
    (_S.ENDING, _T.FALLBACK_PLAYED): _S.ENDED,
    (_S.ENDING, _T.STOPPED): _S.ENDED,
    (_S.ENDING, _T.TRANSPORT_LOST): _S.ENDED,
    (_S.ENDING, _T.FAILED): _S.ENDED,
}
"""Every state change of a call stream. A pair not listed is an error (``_transition``)."""

_TURN_BEHIND_MAX_MS: Final = 5000
"""A ``SpeechStopped`` whose end lies further back than this in the input (or ahead of it) is timed from its arrival."""
_SILENCE_RECHECK_MS: Final = 100
"""A silence deadline held back (the agent replying, a tool running) is looked at again this much later."""
_GREETING_WAIT_MS: Final = 5000
"""How long a greeting that may not be cut keeps the caller from the engine while its reply has not begun."""
_GOODBYE_WAIT_MS: Final = 5000
"""How long a silent caller's hang-up waits for the goodbye's reply to start; then it goes ahead without it."""
_TOLD_WAIT_MS: Final = 1000
"""How long after its playout a tool's result waits for the engine to be told the last response was heard, before
the model is asked to answer it anyway."""
_SEND_FAILED_READ_MS: Final = 1000
"""After a send to the carrier fails, how long the carrier's last messages (a ``stop`` sent before it closed)
may still be read before the stream is taken for dropped."""
TAKEOVER_TELLS_HELD_MS: Final = 200
"""How long a stream that took the call over from a dead process holds what it would tell the engine of what the
caller heard (acks, truncations). The engine's replay after the live ticket comes first on its socket, at once:
it may hold a barge-in the dead stream lived through, then what that stream told of it (``playback.acknowledged``,
``conversation.item.truncated``), which this stream's estimate from an older ticket falls short of. What is held
goes once the replay is in, and only what the engine was not told already."""
_NORMAL_CLOSURE: Final = 1000
_GOING_AWAY: Final = 1001
_POLICY_VIOLATION: Final = 1008


class CallStateError(Exception):
    """The driver called an input the call's state does not allow (a bug in the driver)."""


class DtmfMode(enum.Enum):
    TEXT_ITEM = "text_item"
    IGNORE = "ignore"


@dataclass(frozen=True, slots=True)
class CallOptions:
    engine_rate_hz: int = 16000
    lead_ms: int = 200
    mark_every_frames: int = 5
    """A marker every this many 20 ms of audio (fewer, longer frames count as their 20 ms), after a response's first
    (``FIRST_MARK_FRAMES`` in, or sooner at this interval)."""
    media_message_ms: int = 100
    """The most agent audio one media message carries, where the carrier joins frames (its profile says)."""
    uses_marks: bool = True
    resampler_quality: ResamplerQuality = ResamplerQuality.LD
    dtmf_mode: DtmfMode = DtmfMode.TEXT_ITEM
    failure_tone_ms: int = 600
    """When the engine fails mid-call, the caller hears this long a tone before the hang-up (0: none)."""
    call_actions: bool = False
    """The agent may act on the call (``end_call``, ``send_dtmf``, ``transfer_call``); off: every call refused."""
    transfer_targets: tuple[str, ...] = ()
    first_message_timeout_ms: int = 10_000
    """A connection that has not started its stream this long after ``connected`` is ended."""
    idle_timeout_ms: int = 10_000
    """A started stream that sends nothing this long is taken for dropped (the session waits for the next one)."""
    max_call_ms: int | None = 14_400_000
    """A stream is ended this long after ``connected`` (None: no limit)."""
    turn_silence_ms: int = 500
    """The session's ``server_vad`` silence: a ``SpeechStopped``'s ``audio_end_ms`` includes it (as OpenAI's Realtime
    and the embedded engine give it), so the caller stopped this much earlier (the turn's latency counts it)."""


@dataclass(frozen=True, slots=True)
class SilencePolicy:
    """A caller who says nothing (``[silence]``, or the call's assistant). Silence is the line's: neither the caller
    nor the agent speaking, counted from whichever spoke last (or from the session's start). After ``reprompt_ms``
    of it the model is told ``reprompt`` — once, until the caller speaks again; after ``hangup_ms`` it is told
    ``goodbye`` and the call is hung up once that has played (so a prompted caller has ``hangup_ms`` to answer).
    0: off."""

    reprompt_ms: int = 0
    reprompt: str = ""
    hangup_ms: int = 0
    goodbye: str = ""


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
    engine_failure: str | None
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
    | Observed | RecordingChunk
)
"""What ``CallSession.outputs()`` hands the driver, in the order the call produced it."""


class CallSession:
    """One carrier stream of a call, bound to one engine session. See the module docstring."""

    def __init__(self, codec: ProviderCodec, options: CallOptions) -> None:
        self.codec = codec
        self.options = options
        self._turn_silence_ms = options.turn_silence_ms
        """The session's ``server_vad`` silence (the call's assistant may set its own: ``engine_bound``)."""
        self.state = CallState.AWAITING_START
        self.start_request: StreamStarted | None = None
        self.hangup: HangUp | None = None
        self.close_transport = False
        self.detach_engine = False
        self.end_reason: str | None = None
        self.failure: RemoteProtocolError | None = None
        self.capabilities = Capabilities()
        self.ledger = self._ledger_for(DEFAULT_PROFILE)
        self.call_offset_ms = 0
        """Where this stream's media time 0 falls on the call's input timeline (set by ``engine_bound``)."""
        self.input_ms = 0
        """ms of caller audio handed to the engine over the whole call (the engine's input timeline)."""
        self._inbound = InboundAudio(options.engine_rate_hz, options.resampler_quality)
        """The caller's audio: decoded, gaps filled, resampled, held until the engine is bound (``bridge/inbound.py``)."""
        self._bucket = MessageBucket()
        """The flood limit over the carrier's messages."""
        self._out_encoding = AudioEncoding.PCMU
        self._out_rate_hz = 8000
        """What the agent's audio is sent in: the stream's own format unless its start says otherwise."""
        self._out: list[CallOutput] = []
        self._out_response: str | None = None
        self._out_resampler: StreamResampler | None = None
        self._out_frames: FrameAssembler | None = None
        self._interrupted: set[str] = set()
        """Responses this call has flushed (their later audio is dropped)."""
        self._heard = HeardAccount()
        """What the caller heard of each recent response over the call, and what the engine was told of it."""
        self._late_audio = LateAudioFilter()
        self.late_deltas_dropped = 0
        self.failures_by_engine: str | None = None
        """Why the engine failed this call, if it did (the driver counts it)."""
        self.flushes = 0
        """Barge-in flushes so far (the driver times them)."""
        self._actions_running: dict[str, CarrierCallAction | ApplicationToolCall] = {}
        self._application_tools: frozenset[str] = frozenset()
        self._tool_filler: str | None = None
        self._fillers_said: set[str] = set()
        """Application tool calls whose filler the agent was told to say."""
        self._respond_after_response = False
        """A tool's result went to the model while the agent spoke: a response is asked for when that one ends."""
        self._silence: SilencePolicy | None = None
        self._greeting_muted_until_ms: int | None = None
        """A greeting that may not be cut: the engine hears silence for the caller until it has played (or, where
        its reply has not begun, until then)."""
        self._greeting_response: str | None = None
        self.recorder: StereoRecorder | None = None
        """The stream's recording, where the call is recorded: the driver takes its last chunk as the stream ends."""
        self._goodbye_due_ms: int | None = None
        """A silent caller's goodbye was asked for: the hang-up waits for its reply until then."""
        self._caller_speaking = False
        self._caller_active_ms = 0
        """When the caller last started or stopped speaking (or the session bound): silence counts from there."""
        self._reprompted = False
        """The caller was prompted since they last spoke (once only)."""
        self._silence_checked_ms = -1
        """When the silence was last looked at (``_SILENCE_RECHECK_MS`` from it, at the earliest, again)."""
        self._hang_up_checked_ms = -1
        """When a hang-up after playout was last looked at (a deadline at or before it is spent)."""
        self._caller_stopped_ms: int | None = None
        """When the caller last stopped speaking (the engine's ``SpeechStopped``), until the reply's audio comes."""
        self._respond_checked_ms = -1
        """When ``_respond_when_silent`` last looked (its deadlines are the ones after)."""
        self._last_response: str | None = None
        """The response whose audio came last (``_respond_when_silent`` waits until the engine was told all of it)."""
        self._closing_after_transfer = False
        """The carrier's ``stop`` came while a transfer was under way: the engine session is closed when its result
        comes (``action_finished``), after the model is told it; or by the stream's end, if it never comes."""
        self.hang_up_after_playout: str | None = None
        """The agent asked to end the call: the reason, until its audio has played and the call is hung up."""
        self._limits = StreamLimits(options.first_message_timeout_ms, options.idle_timeout_ms, options.max_call_ms)
        """The limits no message enforces (``bridge/limits.py``)."""
        self.limit_reached: str | None = None
        """The limit that ended the stream (``first_message_timeout``, ``idle_timeout``, ``max_call_duration``)."""
        self._send_failed_at_ms: int | None = None
        self._going_away = False
        self._unheard: UnheardAudio | None = None
        """The rest of the reply playing when the stream dropped, for the next stream (``facts``)."""

    def _ledger_for(self, profile: CarrierProfile) -> PlayoutLedger:
        """The playout ledger for the carrier's way of playing (known once its stream has started)."""
        options = self.options
        frame_ms = profile.frame_ms
        lead_ms = max(profile.lead_ms if profile.lead_ms is not None else options.lead_ms, frame_ms)
        return PlayoutLedger(
            frame_ms=frame_ms,
            lead_ms=lead_ms,
            mark_every_frames=max(1, options.mark_every_frames * 20 // frame_ms),
            first_mark_frames=max(1, min(FIRST_MARK_FRAMES, options.mark_every_frames) * 20 // frame_ms),
            frames_per_message=max(1, min(options.media_message_ms, lead_ms) // frame_ms) if profile.joins_frames else 1,
            uses_marks=options.uses_marks and profile.uses_marks,
            marks_echoed_on_clear=profile.marks_echoed_on_clear,
            flushes=profile.flushes,
        )

    # ------------------------------------------------------------------ inputs

    def connected(self, now_ms: int) -> None:
        """The carrier's connection is open: the limits run from now (``CallOptions``; checked by ``tick``)."""
        self._limits.connected(now_ms)

    def receive_message(self, message: str | bytes, now_ms: int) -> None:
        """One websocket message from the carrier. Then drain every output; a protocol error ends the call."""
        if self.state in (CallState.ENDED, CallState.DETACHED):
            return  # read after the stream ended (a send failed first): nothing is listening any more
        self._limits.message_read(now_ms)
        starting = self.start_request is None
        try:
            self._rate_limit(now_ms)
            events = self.codec.receive_message(message)
            for event in events:
                self._on_carrier_event(event, now_ms)
        except RemoteProtocolError as exc:
            self._fail(exc)
        if starting and self.start_request is not None:
            self._limits.stream_started(now_ms)  # now the idle limit runs
            if self.state is CallState.STARTING:  # not ended in the same read (a start and its stop)
                self._out.append(BindEngine(self.start_request))

    def engine_bound(
        self,
        capabilities: Capabilities,
        now_ms: int,
        call_offset_ms: int | None = None,
        heard_ms: tuple[tuple[str, int], ...] = (),
        unheard: UnheardAudio | None = None,
        told_ms: tuple[tuple[str, int], ...] = (),
        taken_over: bool = False,
        greeting: str | None = None,
        application_tools: frozenset[str] = frozenset(),
        tool_filler: str | None = None,
        silence: SilencePolicy | None = None,
        record: bool = False,
        greeting_interruptible: bool = True,
        call_ends_at_ms: int | None = None,
        turn_silence_ms: int | None = None,
    ) -> None:
        """The engine session for ``start_request`` is open (or resumed): audio flows from now on.

        ``greeting``: the session is new (the call's first stream): the agent speaks first, told this as a text turn
        with a response asked for at once; its reply plays, is heard, cut by barge-in and told as any other — but
        for ``greeting_interruptible`` False: until it has played the engine hears silence in place of the caller
        (vllm-omni cancels any response its VAD hears speech over, so nothing else keeps it from being cut).
        ``application_tools``: the names of the call's application tools (their calls go to the application:
        ``Perform``); ``tool_filler``: what the agent is told to say while one is slow (``tool_slow``).
        ``silence``: what to do with a caller who says nothing (``SilencePolicy``); None: nothing.
        ``call_ends_at_ms``: the call's own limit (its assistant's ``max_duration_s``, on this clock): then it is ended
        as at ``max_call_ms``.
        ``record``: the stream is recorded from now (``recorder``; its chunks come out as ``RecordingChunk``).
        ``turn_silence_ms``: the session's ``server_vad`` silence where the call's assistant set its own.

        ``call_offset_ms``: where this stream starts on the call's timeline (a resumed call's past input).
        ``heard_ms``: the replies earlier streams cut off while the engine was still generating them, and how much
        of each the caller heard (the ticket's ``heard_ms``): the rest of such a reply plays here, and what the
        engine is told of it continues from there (never from 0).
        ``unheard``: the rest of the reply the last stream was playing as it ended; it plays first, from where the
        caller stopped hearing it (where this stream cannot play it, the model's turn is cut to what was heard).
        ``told_ms``: what the engine was told the caller heard of recent responses (the ticket's): this stream tells
        it no less of them.
        ``taken_over``: resumed from a dead process's live ticket; what this stream would tell the engine of what
        was heard waits for the engine's replay (``TAKEOVER_TELLS_HELD_MS``).
        """
        self._transition(_Trigger.ENGINE_BOUND)
        self._application_tools, self._tool_filler = application_tools, tool_filler
        self._silence, self._caller_active_ms = silence, now_ms
        if turn_silence_ms is not None:
            self._turn_silence_ms = turn_silence_ms
        if call_ends_at_ms is not None:
            self._limits.call_ends_at(call_ends_at_ms)
        if record:  # from the caller's first audio kept: it came in real time, up to now
            held_pcm, rate_hz = self._inbound.held_pcm(), self._inbound.rate_hz
            held = sum(map(len, held_pcm)) // PCM16_SAMPLE_BYTES
            self.recorder = self.ledger.recorder = StereoRecorder(
                rate_hz=rate_hz, agent_rate_hz=self._out_rate_hz, agent_encoding=self._out_encoding,
                started_ms=now_ms - held * 1000 // rate_hz,
            )
            for pcm in held_pcm:
                self.recorder.caller(pcm)
        if taken_over:
            self._heard.hold_tells_until(now_ms + TAKEOVER_TELLS_HELD_MS)
        self.capabilities = capabilities
        for response_id, ms in heard_ms:
            self._heard.cut(response_id, ms)
        for response_id, ms in told_ms:
            self._heard.note_told(response_id, ms)
        if call_offset_ms is not None:
            self.input_ms += call_offset_ms - self.call_offset_ms
            self.call_offset_ms = call_offset_ms
        for audio in self._inbound.release():
            self._to_engine(AppendAudio(audio, self.options.engine_rate_hz))
        if greeting:
            self._to_engine(CreateTextItem(greeting))
            self._to_engine(CreateResponse())
            if not greeting_interruptible:
                self._greeting_muted_until_ms = now_ms + _GREETING_WAIT_MS
        if unheard is not None:
            self._play_unheard(unheard, now_ms)
        self.tick(now_ms)

    def _play_unheard(self, unheard: UnheardAudio, now_ms: int) -> None:
        """The last stream's unheard rest of a reply, first: its frames as they were, when this stream carries the
        same audio; its later audio (if the engine was still generating it) follows on the same response."""
        response_id = unheard.response_id
        same = (unheard.encoding, unheard.rate_hz, unheard.frame_ms) == (self._out_encoding.value, self._out_rate_hz, self.ledger.frame_ms)
        if not same:
            heard = self._heard.heard_before(response_id)
            if unheard.ended and heard > 0:
                self._tell(response_id, heard, truncate=True)
            return
        audio = base64.b64decode(unheard.audio)
        frame_bytes = self._out_rate_hz * self._out_encoding.sample_bytes * unheard.frame_ms // 1000
        self.ledger.enqueue(response_id, [audio[i : i + frame_bytes] for i in range(0, len(audio), frame_bytes)], now_ms)
        self._heard.generated(response_id, unheard.generated_ms)
        if unheard.ended:
            self.ledger.end_response(response_id, now_ms)
        else:  # its later audio continues the same frames (``_on_audio``)
            self._out_response = response_id

    def start_refused(self, reason: str) -> None:
        """The stream may not be bridged (someone else's token, a call already over, no registry): close it, touch
        nothing else (a stream that ended meanwhile is left as it ended). No engine for the call: ``no_engine``."""
        if self.state is not CallState.STARTING:
            return
        self._transition(_Trigger.START_REFUSED)
        self.end_reason = reason
        self._close_transport()

    def receive_engine_event(self, event: EngineEvent, now_ms: int) -> None:
        """One event of the call's engine session. Then drain every output."""
        if self.state is not CallState.LIVE:
            return
        if not self._late_audio.admit(event):  # audio of a cancelled response or an older epoch
            self.late_deltas_dropped += 1
            return
        match event:
            case AudioDelta():
                self._on_audio(event, now_ms)
            case SpeechStopped(audio_end_ms, _):  # when the caller stopped, on this stream's clock
                behind_ms = self.input_ms - audio_end_ms
                detected_ms = now_ms - behind_ms if 0 <= behind_ms <= _TURN_BEHIND_MAX_MS else now_ms
                self._caller_stopped_ms = detected_ms - self._turn_silence_ms
                self._caller_speaking, self._caller_active_ms, self._reprompted = False, now_ms, False
            case SpeechStarted():
                self._caller_speaking, self._caller_active_ms, self._reprompted = True, now_ms, False
            case ResponseDone(response_id, status, _, _):
                if status == "cancelled":
                    self._interrupt(response_id, now_ms)
                    self._respond_after_response = False  # the caller took the turn: its response hears the result
                elif response_id == self._out_response:
                    self._finish_response(now_ms)
            case OverlapDecision(action, _, _) if action == "barge_in":
                self._interrupt(self._out_response, now_ms)
            case OutputAudioCleared(response_id):
                self._interrupt(response_id or self._out_response, now_ms)
            case SessionClosed() | SessionExpired():
                reason = f"engine_{type(event).__name__}:{event.reason}"
                if isinstance(event, SessionExpired) or _is_engine_failure(event.reason):
                    self.engine_failed(reason, now_ms)
                else:
                    self._end_by_engine(reason)
            case PlaybackAcknowledged(response_id, played_ms) if response_id is not None:
                self._heard.note_told(response_id, played_ms)
            case ItemTruncated(item_id, audio_end_ms):
                self._heard.engine_truncated(item_id.removeprefix("item_"), audio_end_ms)
            case FunctionCall():
                self._on_function_call(event)
            case SessionReplaced():  # a newer stream took the session over (this one was taken for dead): it
                self._transition(_Trigger.REPLACED)  # ends quietly, the call not over, nothing to detach
                self.end_reason = "session_replaced"
                self._drop_carrier_messages()
                self._going_away = True
                self._close_transport()
            case _:
                pass  # an engine error (the driver logs it) does not end the call
        if self.hang_up_after_playout is not None:
            self._end_for_agent_when_played(now_ms)
        self._respond_when_silent(now_ms)

    def engine_failed(self, reason: str, now_ms: int) -> None:
        """The engine session failed (expired, lost past resume, an engine error): the caller hears a short
        fallback tone instead of silence, then the call is hung up. Agent audio still queued is dropped."""
        if self.state is not CallState.LIVE:
            return
        self.failures_by_engine = reason
        self.ledger.flush(now_ms)
        self.ledger.heard_updates()  # nobody to tell: the session is gone
        self._end_with_tone(reason, now_ms)

    def no_engine(self, reason: str, now_ms: int) -> None:
        """No engine session can be had for the stream (none opens, the parked one is gone): the caller hears the
        fallback tone, not silence, then the call is hung up the carrier's way. The caller's buffered audio goes."""
        if self.state is not CallState.STARTING:
            return
        self._inbound.drop_held()
        self._end_with_tone(reason, now_ms)

    def shut_down(self, now_ms: int) -> None:
        """The process stops with the call still up (a lone process whose drain ran out): the engine is told what
        the caller heard and its session is closed; the caller hears the closing tone, then the carrier's hang-up
        — not a silent drop."""
        if self.state is not CallState.LIVE:
            return
        self._stop_playback(None, now_ms, barge_in=False)
        self._to_engine(CloseSession(EndReason.BRIDGE_SHUTDOWN))
        self._end_with_tone(EndReason.BRIDGE_SHUTDOWN, now_ms)

    def _end_with_tone(self, reason: str, now_ms: int) -> None:
        """ENDING for ``reason``: no more agent audio; the fallback tone is queued (``tick`` hangs up once it has
        played; at once without one)."""
        self._transition(_Trigger.ENGINE_FAILED)
        self.end_reason = reason
        self._out_response = self._out_resampler = self._out_frames = None
        if self.options.failure_tone_ms > 0:
            frames = FrameAssembler(self._out_rate_hz, self._out_encoding, self.ledger.frame_ms)
            tone = encode_from_pcm16(self._out_encoding, _failure_tone(self._out_rate_hz, self.options.failure_tone_ms))
            whole = frames.push(tone)
            tail = frames.flush()  # the tone's last, short frame, padded
            self.ledger.enqueue(_FALLBACK_RESPONSE, whole if tail is None else [*whole, tail], now_ms)
            self.ledger.end_response(_FALLBACK_RESPONSE, now_ms)
        self._drain_ledger(to_engine=False)
        self.tick(now_ms)

    def end_call(self, reason: str, now_ms: int) -> None:
        """The bridge ends the call (a limit was reached): the engine session is closed, the call hung up the
        carrier's way (if it was bridged), the socket closed."""
        if self.state in (CallState.ENDED, CallState.DETACHED):
            return
        bridged = self.state in (CallState.LIVE, CallState.ENDING)
        if self.state is CallState.LIVE:
            self._to_engine(CloseSession(reason))
        self.state = TRANSITIONS[(self.state, _Trigger.FAILED)]
        self.end_reason = reason
        if bridged:
            self._hang_up(reason)
        self._close_transport()

    def carrier_ended(self, reason: str, now_ms: int) -> None:
        """The carrier said out of band (a webhook) that the call is over: as its ``stop`` would."""
        if self.state in (CallState.AWAITING_START, CallState.ENDED, CallState.DETACHED):
            return
        self._on_carrier_event(StreamStopped(), now_ms)
        self.end_reason = reason

    def carrier_digit(self, digit: str, now_ms: int) -> None:
        """The carrier said out of band (a webhook) that the caller pressed ``digit``: as its DTMF event would."""
        if self.state is not CallState.LIVE:
            return  # before the stream started, or after it ended: no call to hear it
        self._on_carrier_event(DtmfReceived(digit), now_ms)

    def message_refused(self, detail: str) -> None:
        """The transport refused a carrier message before reading it (over the websocket's size limit, closed
        1009): bad input, as if the codec had refused it — the stream ends, its call the carrier's way."""
        if self.state in (CallState.ENDED, CallState.DETACHED):
            return
        codec = self.codec
        self._fail(RemoteProtocolError(ProtocolErrorReason.OVERSIZED, detail, provider=codec.provider, stream_id=codec.stream_id))

    def transport_lost(self, now_ms: int) -> None:
        """The carrier's socket closed without ``stop``: keep the engine session for the next stream.

        Whatever the caller had not heard yet is gone with the socket: the engine is told what was heard
        (ack, truncate), as for a barge-in, before the session is detached.
        """
        if self.state in (CallState.ENDED, CallState.DETACHED):
            return
        bound = self.state is CallState.LIVE
        unplayed = self.ledger.unplayed(now_ms) if bound else None
        if unplayed is not None and sum(map(len, unplayed.frames)) <= UNHEARD_KEPT_BYTES:
            # The next stream plays the rest from where the caller stopped hearing it (what the carrier held and
            # what was still queued here); the engine goes on with what it still generates. No truncation.
            cut = unplayed.response_id
            self.ledger.flush(now_ms)
            self._drain_ledger()  # the ack of what was heard
            self._heard.cut(cut, self._heard.on_call(cut, unplayed.from_ms))
            frames_ms = len(unplayed.frames) * self.ledger.frame_ms
            generated = self._heard.generated_ms(cut)  # the frames' last one is padded: no more than was generated
            generated_ms = frames_ms if generated is None else min(frames_ms, int(generated) - unplayed.from_ms)
            audio = base64.b64encode(b"".join(unplayed.frames)).decode()
            encoding = (self._out_encoding.value, self._out_rate_hz, self.ledger.frame_ms)
            self._unheard = UnheardAudio(cut, *encoding, audio, unplayed.ended, generated_ms)
        elif bound and self._out_response is not None:  # still being generated: the next stream plays the rest
            cut = self._out_response
            self.ledger.flush(now_ms)
            self._drain_ledger()  # the ack of what was heard; no truncation: the reply goes on
            self._heard.cut(cut, self._heard.on_call(cut, self.ledger.heard_ms(cut, now_ms)))
        elif bound and self.ledger.is_playing(now_ms):  # complete: nothing more of it will come, cut it here
            self._stop_playback(None, now_ms, barge_in=False)
        self._transition(_Trigger.TRANSPORT_LOST)
        self.end_reason = "transport_lost"
        self.detach_engine = bound
        self._drop_carrier_messages()  # nowhere to send them

    def send_failed(self, now_ms: int) -> None:
        """A send to the carrier failed: its side is closed. Nothing more is played (or sent); what the carrier sent
        before it closed (a ``stop`` after a hang-up) may still be read. If no ``stop`` comes by
        ``_SEND_FAILED_READ_MS``, ``tick`` takes the stream for dropped (its session kept for the next stream);
        meanwhile engine events are left untaken (``takes_engine_events``), for that stream to have."""
        if self.state in (CallState.ENDED, CallState.DETACHED) or self._send_failed_at_ms is not None:
            return
        self._send_failed_at_ms = now_ms
        self._drop_carrier_messages()

    @property
    def takes_engine_events(self) -> bool:
        """Whether ``receive_engine_event`` takes events now: a live stream whose carrier still listens."""
        return self.state is CallState.LIVE and self._send_failed_at_ms is None

    @property
    def close_code(self) -> int:
        """The close code of the carrier's connection when ``close_transport``: a policy violation for a protocol
        error or someone else's token; going away for a stream moved or superseded (no ``stop``: the carrier
        reconnects); else normal. (A moved stream's socket is closed by the driver, with this code, after its
        session is parked.)"""
        if self.failure is not None or self.end_reason == EndReason.BAD_TOKEN:
            return _POLICY_VIOLATION
        return _GOING_AWAY if self._going_away else _NORMAL_CLOSURE

    def superseded(self, now_ms: int) -> None:
        """A newer stream of the call has come (this one's socket is half-open, or slow to notice its drop): end
        this one as a drop, its session kept for the newer stream, and close its socket."""
        if self.state in (CallState.ENDED, CallState.DETACHED):
            return
        self.transport_lost(now_ms)
        self._going_away = True
        self._close_transport()

    def move_elsewhere(self, now_ms: int) -> bool:
        """The process is draining: end this stream as a network drop would, so the carrier's reconnect (its
        redirect) resumes the call on another process; what the caller heard goes to the engine first, and
        the socket is closed going away (no ``stop``). False, and nothing done, for a stream not live or a carrier
        that does not reconnect (``HangUpMode.CLOSE``: closing its socket would end the call; it runs to its end)."""
        if self.codec.profile.hang_up is HangUpMode.CLOSE or self.state is not CallState.LIVE:
            return False
        self.transport_lost(now_ms)
        self._going_away = True  # closed by the driver once the session is parked, so the next stream finds it
        return True

    def tick(self, now_ms: int) -> None:
        """Pace out the frames that are due; end a stream past a limit. Drain ``outputs`` next. On a tick far later
        than the deadline it answers (``PROCESS_STALL_MS``: this process did not run meanwhile, and the tick runs
        before the reader gets to the carrier's messages of that time) the carrier's limits (idle, first message)
        are judged that much later, once the reader has had its turn."""
        limits = self._limits
        if limits.is_due(now_ms) and not limits.deferred:
            limits.put_off_if_late(now_ms, self.next_deadline_ms())
        if self._send_failed_at_ms is not None:  # nothing reaches the carrier: no frame into the void
            if now_ms >= self._send_failed_at_ms + _SEND_FAILED_READ_MS and self.state not in (CallState.ENDED, CallState.DETACHED):
                self.transport_lost(now_ms)
                self._close_transport()  # its receive may not see the close: closing wakes it
            return
        if limits.is_due(now_ms):
            self._check_limits(now_ms)
        held_until = self._heard.held_until_ms
        if held_until is not None and now_ms >= held_until:
            self._release_held_tells()
        if self.state is CallState.LIVE:
            self.ledger.tick(now_ms)
            self._drain_ledger()
            if self.hang_up_after_playout is not None:
                self._end_for_agent_when_played(now_ms)
            self._respond_when_silent(now_ms)
            self._check_silence(now_ms)
        elif self.state is CallState.ENDING:
            self.ledger.tick(now_ms)
            self._drain_ledger(to_engine=False)
            if not self.ledger.is_playing(now_ms):  # the fallback has played out: now hang up
                self._transition(_Trigger.FALLBACK_PLAYED)
                self._hang_up(self.end_reason or "engine_failed")

    # ----------------------------------------------------------------- reports

    @property
    def finished(self) -> bool:
        """The stream is over: ended with the call, or its session left for the next stream."""
        return self.state is CallState.ENDED or self.state is CallState.DETACHED

    def facts(self) -> StreamFacts:
        """What the stream's ``CallLifecycle`` needs of it, now."""
        return StreamFacts(
            awaiting_engine=self.state is CallState.STARTING,
            call_over=self.state is CallState.ENDED,
            end_reason=self.end_reason,
            detach=self.detach_engine,
            input_ms=self.input_ms,
            heard_ms=self.cut_replies,
            unheard=self._unheard,
            told_ms=self.told_so_far,
        )

    def report(self) -> StreamReport:
        """The stream's account of itself, as it ends."""
        ledger = self.ledger
        return StreamReport(
            facts=self.facts(),
            limit_reached=self.limit_reached,
            engine_failure=self.failures_by_engine,
            failure=self.failure,
            stream_input_ms=self._inbound.stream_media_ms,
            output_ms=ledger.frames_sent * ledger.frame_ms,
            frames_sent=ledger.frames_sent,
            frames_flushed=ledger.frames_dropped,
            barge_ins=self.flushes,
            late_deltas_dropped=self.late_deltas_dropped,
            heard_corrections=ledger.corrections,
            playout_underruns=ledger.underruns,
        )

    # ----------------------------------------------------------------- outputs

    @property
    def stream_input_ms(self) -> int:
        """ms of caller audio this stream carried (gaps filled included)."""
        return self._inbound.stream_media_ms

    @property
    def cut_replies(self) -> tuple[tuple[str, int], ...]:
        """For the call's next stream (``engine_bound(heard_ms=…)``, through the resume ticket): the replies cut off
        by this stream's end or an earlier one's while being generated, newest last, with what the caller heard of
        each over the call."""
        return self._heard.cut_replies

    @property
    def told_so_far(self) -> tuple[tuple[str, int], ...]:
        """For the call's next stream (its ticket's ``told_ms``, live or parked): the most the engine was told the
        caller heard of each recent response."""
        return self._heard.told_so_far

    def heard_so_far(self, now_ms: int) -> tuple[tuple[str, int], ...]:
        """For the stream's live ticket (a stream that takes the call over from it, should this process die): the
        cut-off replies (``cut_replies``) and the reply still being generated, with what the caller has heard of
        it so far; that stream's acks of it count on from there."""
        playing = self._out_response
        if self.state is CallState.LIVE and playing is not None:
            return self._heard.with_playing(playing, self._heard.on_call(playing, self.ledger.heard_ms(playing, now_ms)))
        return self._heard.cut_replies

    def outputs(self) -> list[CallOutput]:
        """Everything the call produced since the last call, in the order it was produced: do each in turn."""
        out, self._out = self._out, []
        lags = self.ledger.mark_lags_ms
        if lags:  # a marker echo every few frames, not every frame
            out.extend(MarkLag(lag_ms) for lag_ms in lags)
            lags.clear()
        return out

    def _to_engine(self, command: EngineCommand) -> None:
        self._out.append(ToEngine(command))

    def _close_transport(self) -> None:
        if not self.close_transport:
            self.close_transport = True
            self._out.append(CloseTransport(self.close_code))

    def _drop_carrier_messages(self) -> None:
        """Nothing reaches the carrier any more: its messages go (and a flush whose clear is never sent)."""
        self._out = [output for output in self._out if not isinstance(output, (ToCarrier, BargeInFlushed))]

    def next_deadline_ms(self) -> int | None:
        if self._send_failed_at_ms is not None:
            ended = self.state in (CallState.ENDED, CallState.DETACHED)
            return None if ended else self._send_failed_at_ms + _SEND_FAILED_READ_MS
        playout = self._playout_deadline_ms()
        limits = self._limits.due_ms if self.state not in (CallState.ENDED, CallState.DETACHED) else None
        silence = self._silence_due_ms()
        due = [deadline for deadline in (playout, limits, self._heard.held_until_ms, silence) if deadline is not None]
        return min(due) if due else None

    def _check_limits(self, now_ms: int) -> None:
        """The limits no message enforces (``StreamLimits``): a connection that never starts its stream, a stream
        past the longest call (ended), a stream gone quiet (taken as dropped: the session waits for the next one)."""
        if self.state in (CallState.ENDED, CallState.DETACHED):
            self._limits.stop()
            return
        reached = self._limits.verdict(now_ms, started=self.start_request is not None)
        if reached is None:
            return
        self.limit_reached = reached
        if reached != IDLE_TIMEOUT:
            self.end_call(reached, now_ms)
            return
        self.transport_lost(now_ms)
        self.end_reason = reached
        self._close_transport()  # the socket may still be open (half-open): close it

    def _playout_deadline_ms(self) -> int | None:
        if self.state is CallState.ENDING:  # the next frame of the fallback, or the moment it has played out
            return self.ledger.next_deadline_ms() or self.ledger.playing_until_ms
        if self.state is not CallState.LIVE:
            return None
        if self.hang_up_after_playout is not None and self._out_response is None:  # hang up once it has played
            # once looked at, the end of playout (or the goodbye's wait) stays in the past: no busy loop on it
            ends = [d for d in (self.ledger.playing_until_ms, self._goodbye_due_ms) if d is not None and d > self._hang_up_checked_ms]
            deadlines = [d for d in (self.ledger.next_deadline_ms(), *ends) if d is not None]
            return min(deadlines) if deadlines else None
        if self._respond_after_response and self._out_response is None:  # a tool's result: answered once played
            until = self.ledger.playing_until_ms
            due = (until, until + _TOLD_WAIT_MS)
            deadlines = [d for d in (self.ledger.next_deadline_ms(), *due) if d is not None and d > self._respond_checked_ms]
            return min(deadlines) if deadlines else None
        return self.ledger.next_deadline_ms()

    # ------------------------------------------------------------ agent actions

    def action_finished(self, call_id: str, result: ActionResult, now_ms: int) -> None:
        """The carrier work of ``PendingAction`` ``call_id`` is over: the model hears the result; a transfer that
        succeeded ends the call (hung up the carrier's way — SIP's BYE after the REFER — unless the call has
        left the bridge with it). Then drain every output."""
        action = self._actions_running.pop(call_id, None)
        if action is not None and self._closing_after_transfer and isinstance(action, TransferCall):
            # The stream stopped while the transfer was under way: its result decides how the call ended.
            self._closing_after_transfer = False
            self._to_engine(FunctionCallOutput(call_id, result.output()))
            if result.ok:
                self.end_reason = "transferred"
            self._to_engine(CloseSession("transferred" if result.ok else "call_ended"))
            return
        if action is None or self.state is not CallState.LIVE:
            return  # the call ended meanwhile: nobody to tell
        self._to_engine(FunctionCallOutput(call_id, result.output()))
        if isinstance(action, ApplicationToolCall):  # the model speaks to the result: now, or after what it is saying
            self._fillers_said.discard(call_id)
            if self._responding(now_ms):
                self._respond_after_response = True
            else:
                self._to_engine(CreateResponse())
        if isinstance(action, TransferCall) and result.ok:
            self._end_by_agent("transferred", hang_up=not result.call_left)

    def tool_slow(self, call_id: str, now_ms: int) -> None:
        """The application's tool ``call_id`` has not answered yet (``app.tool_filler_after_s``): where a filler is
        configured and the agent is silent, it is told to say it (once per tool call). Then drain every output."""
        if (
            self._tool_filler is None or self.state is not CallState.LIVE or call_id not in self._actions_running
            or call_id in self._fillers_said or self._responding(now_ms)
        ):  # fmt: skip
            return
        self._fillers_said.add(call_id)
        self._to_engine(CreateTextItem(self._tool_filler))
        self._to_engine(CreateResponse())

    def _greeting_plays(self, now_ms: int) -> bool:
        """A greeting that may not be cut is still to come or playing (then, for good, False)."""
        assert self._greeting_muted_until_ms is not None
        if self._greeting_response is None:
            plays = now_ms < self._greeting_muted_until_ms  # its reply has not begun: not waited for forever
        else:
            plays = self._out_response == self._greeting_response or self.ledger.is_playing(now_ms)
        if not plays:
            self._greeting_muted_until_ms = None
        return plays

    def _silence_due_ms(self) -> int | None:
        """When the caller's silence next calls for something (``SilencePolicy``), or None."""
        policy = self._silence
        if policy is None or self.state is not CallState.LIVE or self._caller_speaking or self.hang_up_after_playout is not None:
            return None
        quiet_since, due = self._line_quiet_since_ms(), []
        if policy.hangup_ms:
            due.append(quiet_since + policy.hangup_ms)
        if policy.reprompt_ms and not self._reprompted:
            due.append(quiet_since + policy.reprompt_ms)
        # held back (the agent replying, a tool running): looked at again a little later, not at every tick
        return max(min(due), self._silence_checked_ms + _SILENCE_RECHECK_MS) if due else None

    def _check_silence(self, now_ms: int) -> None:
        """The caller has said nothing for long enough: the model is told to prompt them, or to say goodbye (and the
        call is hung up once that has played). Never while the agent is speaking or a reply is coming."""
        policy = self._silence
        if policy is None or self._caller_speaking or self.hang_up_after_playout is not None:
            return
        self._silence_checked_ms = now_ms
        if self._responding(now_ms) or self._actions_running:
            return
        quiet_ms = now_ms - self._line_quiet_since_ms()
        if policy.hangup_ms and quiet_ms >= policy.hangup_ms:
            self._to_engine(CreateTextItem(policy.goodbye))
            self._to_engine(CreateResponse())
            self.hang_up_after_playout = "caller_silent"
            self._goodbye_due_ms = now_ms + _GOODBYE_WAIT_MS  # its reply plays first (if it comes)
            self._out.append(Observed("silence", quiet_ms, detail="hang_up"))
        elif policy.reprompt_ms and not self._reprompted and quiet_ms >= policy.reprompt_ms:
            self._reprompted = True
            self._to_engine(CreateTextItem(policy.reprompt))
            self._to_engine(CreateResponse())
            self._out.append(Observed("silence", quiet_ms, detail="reprompt"))

    def _line_quiet_since_ms(self) -> int:
        """Since when neither the caller nor the agent has spoken (the session's start at the earliest)."""
        return max(self._caller_active_ms, self.ledger.playing_until_ms)

    def _respond_when_silent(self, now_ms: int) -> None:
        """A tool's result reached the model while the agent spoke: once that has played out and the engine was
        told so (it refuses a response while it counts the last one as playing: ``response_already_active``), the
        model answers it; at most ``_TOLD_WAIT_MS`` after the playout, told or not (a carrier's last mark lost)."""
        if not self._respond_after_response or self.state is not CallState.LIVE:
            return
        self._respond_checked_ms = now_ms
        if self._responding(now_ms):
            return
        last = self._last_response
        told = last is None or self._heard.told(last) >= int(self._heard.generated_ms(last) or 0.0) - self.ledger.frame_ms
        if told or now_ms >= self.ledger.playing_until_ms + _TOLD_WAIT_MS:
            self._respond_after_response = False
            self._to_engine(CreateResponse())

    def _responding(self, now_ms: int) -> bool:
        """The agent's reply is arriving or playing."""
        return self._out_response is not None or self.ledger.is_playing(now_ms)

    def _on_function_call(self, call: FunctionCall) -> None:
        options = self.options
        if call.name in self._application_tools:
            if self.hang_up_after_playout is not None or any(isinstance(a, TransferCall) for a in self._actions_running.values()):
                busy = "the call is ending" if self.hang_up_after_playout is not None else "a transfer is in progress"
                self._to_engine(FunctionCallOutput(call.call_id, ActionResult.failed("busy", busy).output()))
                return
            tool = ApplicationToolCall(call.name, dict(call.arguments))
            self._actions_running[call.call_id] = tool
            self._out.append(Perform(PendingAction(call.call_id, tool)))
            return
        action = (
            parse_call(call, options.transfer_targets)
            if options.call_actions
            else ActionResult.failed("unknown_tool", "call actions are disabled")
        )
        if isinstance(action, ActionResult):
            self._to_engine(FunctionCallOutput(call.call_id, action.output()))
        elif isinstance(action, EndCall):
            self._to_engine(FunctionCallOutput(call.call_id, ActionResult.done().output()))
            self.hang_up_after_playout = self.hang_up_after_playout or "agent_hung_up"
        elif self.hang_up_after_playout is not None or any(isinstance(a, TransferCall) for a in self._actions_running.values()):
            busy = "the call is ending" if self.hang_up_after_playout is not None else "a transfer is in progress"
            self._to_engine(FunctionCallOutput(call.call_id, ActionResult.failed("busy", busy).output()))
        else:
            self._actions_running[call.call_id] = action
            self._out.append(Perform(PendingAction(call.call_id, action)))

    def _end_for_agent_when_played(self, now_ms: int) -> None:
        """``end_call``: once the response being received has ended and its audio has played, hang up."""
        reason = self.hang_up_after_playout
        self._hang_up_checked_ms = now_ms
        if reason is None or self.state is not CallState.LIVE or self._out_response is not None or self.ledger.is_playing(now_ms):
            return
        if self._goodbye_due_ms is not None and now_ms < self._goodbye_due_ms:
            return  # the goodbye asked for has not come yet
        self._end_by_agent(reason, hang_up=True)

    def _end_by_agent(self, reason: str, *, hang_up: bool) -> None:
        self._transition(_Trigger.AGENT_ENDED)
        self.end_reason = reason
        self._to_engine(CloseSession(reason))
        self._actions_running.clear()
        if hang_up:
            self._hang_up(reason)
        self._close_transport()

    # ------------------------------------------------------------- carrier side

    def _on_carrier_event(self, event: CarrierEvent, now_ms: int) -> None:
        match event:
            case MediaReceived(payload, timestamp_ms):
                self._transition(_Trigger.CARRIER_EVENT)
                self._on_media(payload, timestamp_ms, now_ms)
            case MarkEchoed(name):
                self._transition(_Trigger.CARRIER_EVENT)
                # when it arrived, as far as we know: read late in a backlog, it says nothing of the carrier
                self.ledger.mark_echoed(name, now_ms - self._inbound.read_lag_ms)
                self._drain_ledger(to_engine=self.state is CallState.LIVE)  # not the failure tone's
                self._respond_when_silent(now_ms)
            case DtmfReceived(digit):
                self._transition(_Trigger.CARRIER_EVENT)
                self._out.append(Notice(event))
                self._out.append(Observed("dtmf", detail=digit))
                if self.options.dtmf_mode is DtmfMode.TEXT_ITEM and self.state is CallState.LIVE:
                    self._to_engine(CreateTextItem(f"DTMF {digit}"))
            case StreamStarted():
                self._transition(_Trigger.STARTED)
                self.start_request = event
                self.ledger = self._ledger_for(self.codec.profile)
                self._inbound.start(event.encoding, event.rate_hz)
                self._out_encoding = event.out_encoding or event.encoding
                self._out_rate_hz = event.out_rate_hz or event.rate_hz
            case StreamStopped():
                bound = self.state is CallState.LIVE
                self._transition(_Trigger.STOPPED)
                self.end_reason = "caller_hung_up"
                transferring = bound and any(isinstance(a, TransferCall) for a in self._actions_running.values())
                if transferring:  # most likely the transfer's own doing (a carrier stops the stream as the transfer lands)
                    self._closing_after_transfer = True  # the model hears its result first (``action_finished``)
                elif bound:
                    self._to_engine(CloseSession("call_ended"))
                self._close_transport()
            case StreamConnected():
                self._transition(_Trigger.CONNECTED)
            case PlaybackCleared():
                self._transition(_Trigger.CARRIER_EVENT)
            case CarrierNotice() | UnknownCarrierEvent():
                self._out.append(Notice(event))

    def _on_media(self, payload: bytes, timestamp_ms: int | None, now_ms: int) -> None:
        if self.state is CallState.ENDING:
            return  # no engine to hear it
        inbound = self._inbound
        if inbound.first_media_at_ms is None:
            self._out.append(CallerAudioBegan())
        try:
            read = inbound.receive(payload, timestamp_ms, now_ms)
        except MediaAhead as exc:
            raise RemoteProtocolError(
                ProtocolErrorReason.FLOOD, str(exc), provider=self.codec.provider, stream_id=self.codec.stream_id
            ) from None
        self.input_ms += read.ms
        recorder = self.recorder
        if recorder is not None:
            recorder.caller(read.pcm)
            chunk = recorder.take(now_ms)
            if chunk is not None:
                self._out.append(RecordingChunk(chunk))
        if self.state is CallState.LIVE:
            self._caller_audio_to_engine(read, now_ms)
        else:
            inbound.hold(read)

    def _caller_audio_to_engine(self, read: CallerAudio, now_ms: int) -> None:
        audio = read.audio
        if not audio:
            return
        if self._greeting_muted_until_ms is not None and self._greeting_plays(now_ms):
            audio = bytes(len(audio))  # the caller's words over a greeting that may not be cut: not heard
        self._to_engine(AppendAudio(audio, self.options.engine_rate_hz))

    def _rate_limit(self, now_ms: int) -> None:
        """The flood limit (``MessageBucket``): one message read at ``now_ms``."""
        if not self._bucket.take(now_ms, started=self.start_request is not None):
            raise RemoteProtocolError(
                ProtocolErrorReason.FLOOD, "more messages than a media stream sends", provider=self.codec.provider
            )

    # -------------------------------------------------------------- engine side

    def _on_audio(self, delta: AudioDelta, now_ms: int) -> None:
        if delta.response_id in self._interrupted:
            self.late_deltas_dropped += 1
            return
        if delta.response_id != self._out_response or self._out_resampler is None:
            if self._out_response is not None and self._out_response != delta.response_id:
                self._finish_response(now_ms)
            self._out_response = self._last_response = delta.response_id
            if self._greeting_muted_until_ms is not None and self._greeting_response is None:
                self._greeting_response = delta.response_id  # the first reply of a new session: the greeting
            self._goodbye_due_ms = None  # a goodbye asked for is this reply: it plays, then the hang-up
            if self._caller_stopped_ms is not None:  # the reply to the caller's turn: its first audio goes out now
                self._out.append(Observed("turn", max(0, now_ms - self._caller_stopped_ms), response_id=delta.response_id))
                self._caller_stopped_ms = None
            self._out_resampler = StreamResampler(delta.rate_hz, self._out_rate_hz, self.options.resampler_quality)
            self._out_frames = FrameAssembler(self._out_rate_hz, self._out_encoding, self.ledger.frame_ms)
            self._heard.response_began()
        response_id = delta.response_id
        self._heard.generated(response_id, len(delta.pcm) * 500 / delta.rate_hz)
        self._enqueue_pcm(self._out_resampler.process(delta.pcm), now_ms)

    def _enqueue_pcm(self, pcm: bytes, now_ms: int) -> None:
        assert self._out_frames is not None and self._out_response is not None
        if pcm:
            self.ledger.enqueue(self._out_response, self._out_frames.push(encode_from_pcm16(self._out_encoding, pcm)), now_ms)
        self._drain_ledger()

    def _finish_response(self, now_ms: int) -> None:
        """The response's audio is complete: drain the resampler, pad the last frame, mark its end."""
        if self._out_response is not None and self._out_resampler is None:  # only the last stream's rest played here
            self.ledger.end_response(self._out_response, now_ms)
            self._out_response = None
            self._drain_ledger()
            return
        if self._out_response is None or self._out_resampler is None or self._out_frames is None:
            return
        self._enqueue_pcm(self._out_resampler.flush(), now_ms)
        tail = self._out_frames.flush()
        if tail is not None:
            self.ledger.enqueue(self._out_response, [tail], now_ms)
        self.ledger.end_response(self._out_response, now_ms)
        self._out_response = self._out_resampler = self._out_frames = None
        self._drain_ledger()

    def _interrupt(self, response_id: str | None, now_ms: int) -> None:
        """Barge-in: stop the agent's audio at the carrier, tell the engine what was heard."""
        if response_id is None or response_id in self._interrupted:
            return
        self._interrupted.add(response_id)
        if response_id == self._out_response:
            self._out_response = self._out_resampler = self._out_frames = None
        self._stop_playback(response_id, now_ms)

    def _stop_playback(self, response_id: str | None, now_ms: int, *, barge_in: bool = True) -> None:
        """Flush the ledger (the carrier's clear), ack what was heard and cut the model's turn to it — clamped
        to [0, sent], skipped before any audio — if the response playing is ``response_id`` (None: any).
        ``barge_in``: the caller's doing (counted and timed as a barge-in)."""
        result = self.ledger.flush(now_ms)
        self._drain_ledger_to_carrier()  # the carrier's clear
        if barge_in:
            self.flushes += 1
            self._out.append(BargeInFlushed(result.response_id))
        self._drain_heard()
        if result.response_id is None or response_id not in (None, result.response_id):
            return
        heard = self._heard.on_call(result.response_id, max(0, min(result.heard_ms, result.sent_ms)))
        if heard > 0:
            self._tell(result.response_id, heard, truncate=True)
        if barge_in:
            generated = self._heard.generated_ms(result.response_id)
            self._out.append(Observed("barge-in", heard, round(generated) if generated is not None else None, result.response_id))

    def _end_by_engine(self, reason: str) -> None:
        self._transition(_Trigger.ENGINE_ENDED)
        self.end_reason = reason
        self._hang_up(reason)

    def _hang_up(self, reason: str) -> None:
        """End the phone call the carrier's way (REST by the driver, in band, or by closing), then the socket."""
        mode = self.codec.profile.hang_up
        if mode is HangUpMode.REST:
            self.hangup = HangUp(reason)
            self._out.append(HangUpCall(reason))
        elif mode is HangUpMode.IN_BAND:
            message = self.codec.send(HangUp(reason))
            if message is not None:
                self._out.append(ToCarrier(message))
        self._close_transport()

    def _drain_ledger(self, *, to_engine: bool = True) -> None:
        """The ledger's frames, markers and clears to the carrier first (a clear is the most urgent thing there
        is), then what was heard to the engine."""
        self._drain_ledger_to_carrier()
        self._drain_heard(to_engine=to_engine)

    def _drain_ledger_to_carrier(self) -> None:
        for action in self.ledger.actions_to_send():
            message = self.codec.send(action)
            if message is not None and self._send_failed_at_ms is None:  # after a failed send: nobody listens
                self._out.append(ToCarrier(message))

    def _drain_heard(self, *, to_engine: bool = True) -> None:
        updates = self.ledger.heard_updates()
        if not to_engine:
            return  # nobody to tell (the session is gone)
        for update in updates:
            self._tell(update.response_id, self._heard.on_call(update.response_id, update.heard_ms), truncate=False)

    def _tell(self, response_id: str, heard_ms: int, *, truncate: bool) -> None:
        """Tell the engine the caller heard ``heard_ms`` of ``response_id``: an ack, or a truncation there (where
        the engine can truncate); never less than it was told before. Held while a takeover's replay comes in
        (``TAKEOVER_TELLS_HELD_MS``)."""
        command = self._heard.tell(response_id, heard_ms, truncate=truncate and self.capabilities.supports_audio_truncate)
        if command is not None:
            self._to_engine(command)

    def _release_held_tells(self) -> None:
        """A takeover's replay is in: tell the engine what was held back, where it was not told as much already."""
        for command in self._heard.release_held():
            self._to_engine(command)

    # ------------------------------------------------------------------- state

    def _transition(self, trigger: _Trigger) -> None:
        if trigger is _Trigger.CARRIER_EVENT and self.state is CallState.LIVE:
            return  # every media frame of a live call: (LIVE, CARRIER_EVENT) → LIVE without hashing enums
        try:
            self.state = TRANSITIONS[(self.state, trigger)]
        except KeyError:
            if trigger in (_Trigger.CARRIER_EVENT, _Trigger.STARTED, _Trigger.CONNECTED, _Trigger.STOPPED):
                raise RemoteProtocolError(
                    ProtocolErrorReason.OUT_OF_ORDER,
                    f"{trigger.value} while {self.state.value}",
                    provider=self.codec.provider,
                    stream_id=self.codec.stream_id,
                ) from None
            raise CallStateError(f"{trigger.value} while {self.state.value}") from None
        if self._heard.held_until_ms is not None and self.state is not CallState.LIVE:
            if trigger is _Trigger.REPLACED:  # the session is another stream's now: nothing of it is this one's to tell
                self._heard.drop_held()
            else:  # the stream ends before the replay is in: what it holds goes now or never
                self._release_held_tells()

    def _fail(self, exc: RemoteProtocolError) -> None:
        bound = self.state is CallState.LIVE
        self.failure = exc
        self.state = TRANSITIONS[(self.state, _Trigger.FAILED)]
        self.end_reason = f"protocol_error:{exc.reason.value}"
        if bound:
            self._to_engine(CloseSession("carrier_protocol_error"))
        if self.start_request is not None:  # a known call, bound or being bound: it ends, the carrier's way
            self._hang_up(self.end_reason)
        self._close_transport()


_FALLBACK_RESPONSE: Final = "engine_failure"
_ENGINE_FAILURES: Final = frozenset(
    {ErrorCode.CONNECTION_FAILED, ErrorCode.PROTOCOL_ERROR, ErrorCode.INTERNAL_ERROR, "client_error", "transport_error"}
    # the server going away (vllm-omni's close_all_sessions at shutdown, a torn-down request, a lost socket it
    # could not keep): the call did not end on purpose
    | {"shutdown", "request_cleanup", "disconnect", "open_abandoned", "session_created_undelivered"}
    | FATAL_RESUME_CODES
)


def _is_engine_failure(reason: str) -> bool:
    """A session end that is a failure (not the agent or the bridge ending the call on purpose)."""
    return reason in _ENGINE_FAILURES or reason.startswith("resync_required")


def engine_failure_kind(reason: str) -> str:
    """``failures_by_engine`` as a metric label from a bounded set: the engine's code (``connection_failed``,
    ``session_resume_expired``, ``shutdown``…), ``expired`` (the engine's grace or idle TTL), ``resync_required``,
    ``engine_stream_failed`` (the bridge could not read the session), else ``other``."""
    code = reason.rpartition(":")[2]
    if reason.startswith("engine_SessionExpired"):
        return "expired"
    if "resync_required" in reason:
        return "resync_required"
    if code in _ENGINE_FAILURES or code == "engine_stream_failed":
        return code
    return "other"


def _failure_tone(rate_hz: int, ms: int) -> bytes:
    """The reorder tone (480 + 620 Hz, 250 ms on / 250 ms off), PCM16 at ``rate_hz``: "this call cannot go on"."""
    t = np.arange(rate_hz * ms // 1000) / rate_hz
    tone = (np.sin(2 * np.pi * 480 * t) + np.sin(2 * np.pi * 620 * t)) * 4000
    tone[(t % 0.5) >= 0.25] = 0
    return tone.astype("<i2").tobytes()
