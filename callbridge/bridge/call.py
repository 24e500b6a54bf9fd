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

Parts (each sans-I/O, with its own state; this class is their composition and the state table): the caller's
audio and the flood limit (``bridge/inbound.py``), the agent's audio (``bridge/agent_audio.py``), what the caller
heard of each reply over the call (``bridge/heard.py``), the stream's limits (``bridge/limits.py``), the agent's
turns (``bridge/turns.py``: silence, an uncuttable greeting, what waits for a reply to play out) and its function
calls (``bridge/agent_actions.py``). A new behaviour is a part of its own, not more attributes here.

A carrier message that breaks the protocol ends the call: the error is kept
in ``failure`` for the driver to log, the engine session is closed, the
call hung up, the socket closed. Nothing here touches another call.
"""

from __future__ import annotations

import base64
import enum
from dataclasses import dataclass
from typing import Final

from callbridge.bridge.actions import (
    ActionResult,
    ApplicationToolCall,
    TransferCall,
)
from callbridge.bridge.agent_actions import AgentActions
from callbridge.bridge.agent_audio import AgentAudio
from callbridge.bridge.binding import EngineBinding
from callbridge.bridge.call_outputs import (
    BargeInFlushed,
    BindEngine,
    CallerAudioBegan,
    CallOutput,
    CloseTransport,
    HangUpCall,
    MarkLag,
    Notice,
    Observed,
    RecordingChunk,
    StreamReport,
    ToCarrier,
    ToEngine,
)
from callbridge.bridge.heard import HeardAccount
from callbridge.bridge.inbound import InboundAudio, MediaAhead, MessageBucket
from callbridge.bridge.lifecycle import EndReason, StreamFacts
from callbridge.bridge.limits import IDLE_TIMEOUT, StreamLimits
from callbridge.bridge.playout import PlayoutLedger
from callbridge.bridge.recording import StereoRecorder
from callbridge.bridge.turns import AfterReply, GreetingGuard, SilenceWatch
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
    ResamplerQuality,
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
    "FIRST_MARK_FRAMES",
    "TAKEOVER_TELLS_HELD_MS",
    "TRANSITIONS",
    "CallOptions",
    "CallSession",
    "CallState",
    "CallStateError",
    "DtmfMode",
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
        self._agent = AgentAudio(options.resampler_quality)
        """The agent's audio: the response arriving, resampled, encoded and framed (``bridge/agent_audio.py``)."""
        self._out: list[CallOutput] = []
        self._heard = HeardAccount()
        """What the caller heard of each recent response over the call, and what the engine was told of it."""
        self._late_audio = LateAudioFilter()
        self.late_deltas_dropped = 0
        self.failures_by_engine: str | None = None
        """Why the engine failed this call, if it did (the driver counts it)."""
        self.flushes = 0
        """Barge-in flushes so far (the driver times them)."""
        self._actions = AgentActions(options.call_actions, options.transfer_targets)
        """The agent's function calls under way (``bridge/agent_actions.py``)."""
        self._silence = SilenceWatch()
        """A caller who says nothing (``bridge/turns.py``)."""
        self._greeting = GreetingGuard()
        """A greeting that may not be cut."""
        self._after_reply = AfterReply()
        """What waits for the agent's reply to play out: a tool's answer, the hang-up."""
        self.recorder: StereoRecorder | None = None
        """The stream's recording, where the call is recorded: the driver takes its last chunk as the stream ends."""
        self._caller_stopped_ms: int | None = None
        """When the caller last stopped speaking (the engine's ``SpeechStopped``), until the reply's audio comes."""
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

    def engine_bound(self, binding: EngineBinding, now_ms: int) -> None:
        """The engine session for ``start_request`` is open (or resumed): audio flows from now on. ``binding``: the
        session (its capabilities, where a resumed call left off) and what the call's agent does on this stream."""
        self._transition(_Trigger.ENGINE_BOUND)
        agent = binding.agent
        self._actions.bound(agent.application_tools, agent.tool_filler)
        self._silence.bound(agent.silence, now_ms)
        if agent.turn_silence_ms is not None:
            self._turn_silence_ms = agent.turn_silence_ms
        if agent.call_ends_at_ms is not None:
            self._limits.call_ends_at(agent.call_ends_at_ms)
        if agent.record:
            self._record_from(now_ms)
        if binding.taken_over:
            self._heard.hold_tells_until(now_ms + TAKEOVER_TELLS_HELD_MS)
        self.capabilities = binding.capabilities
        for response_id, ms in binding.heard_ms:
            self._heard.cut(response_id, ms)
        for response_id, ms in binding.told_ms:
            self._heard.note_told(response_id, ms)
        if binding.call_offset_ms is not None:
            self.input_ms += binding.call_offset_ms - self.call_offset_ms
            self.call_offset_ms = binding.call_offset_ms
        for audio in self._inbound.release():
            self._to_engine(AppendAudio(audio, self.options.engine_rate_hz))
        if agent.greeting:
            self._to_engine(CreateTextItem(agent.greeting))
            self._to_engine(CreateResponse())
            if not agent.greeting_interruptible:
                self._greeting.guard(now_ms)
        if binding.unheard is not None:
            self._play_unheard(binding.unheard, now_ms)
        self.tick(now_ms)

    def _record_from(self, now_ms: int) -> None:
        """Record the stream from the caller's first audio kept (it came in real time, up to now)."""
        held_pcm, rate_hz = self._inbound.held_pcm(), self._inbound.rate_hz
        held = sum(map(len, held_pcm)) // PCM16_SAMPLE_BYTES
        self.recorder = self.ledger.recorder = StereoRecorder(
            rate_hz=rate_hz, agent_rate_hz=self._agent.rate_hz, agent_encoding=self._agent.encoding,
            started_ms=now_ms - held * 1000 // rate_hz,
        )
        for pcm in held_pcm:
            self.recorder.caller(pcm)

    def _play_unheard(self, unheard: UnheardAudio, now_ms: int) -> None:
        """The last stream's unheard rest of a reply, first: its frames as they were, when this stream carries the
        same audio; its later audio (if the engine was still generating it) follows on the same response."""
        response_id = unheard.response_id
        if not self._agent.carries(unheard):
            heard = self._heard.heard_before(response_id)
            if unheard.ended and heard > 0:
                self._tell(response_id, heard, truncate=True)
            return
        frames = self._agent.unheard_frames(unheard, base64.b64decode(unheard.audio))
        self.ledger.enqueue(response_id, frames, now_ms)
        self._heard.generated(response_id, unheard.generated_ms)
        if unheard.ended:
            self.ledger.end_response(response_id, now_ms)
        else:  # its later audio continues the same frames (``_on_audio``)
            self._agent.continue_unheard(response_id)

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
                self._silence.caller_spoke(speaking=False, now_ms=now_ms)
            case SpeechStarted():
                self._silence.caller_spoke(speaking=True, now_ms=now_ms)
            case ResponseDone(response_id, status, _, _):
                if status == "cancelled":
                    self._interrupt(response_id, now_ms)
                    self._after_reply.respond = False  # the caller took the turn: its response hears the result
                elif response_id == self._agent.response_id:
                    self._finish_response(now_ms)
            case OverlapDecision(action, _, _) if action == "barge_in":
                self._interrupt(self._agent.response_id, now_ms)
            case OutputAudioCleared(response_id):
                self._interrupt(response_id or self._agent.response_id, now_ms)
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
        if self._after_reply.hang_up_reason is not None:
            self._hang_up_when_played(now_ms)
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
        self._agent.stop()
        if self.options.failure_tone_ms > 0:
            self.ledger.enqueue(_FALLBACK_RESPONSE, self._agent.tone(self.options.failure_tone_ms), now_ms)
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
            encoding = (self._agent.encoding.value, self._agent.rate_hz, self.ledger.frame_ms)
            self._unheard = UnheardAudio(cut, *encoding, audio, unplayed.ended, generated_ms)
        elif bound and self._agent.response_id is not None:  # still being generated: the next stream plays the rest
            cut = self._agent.response_id
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
            if self._after_reply.hang_up_reason is not None:
                self._hang_up_when_played(now_ms)
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
        """For the call's next stream (``EngineBinding.heard_ms``, through the resume ticket): the replies cut off
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
        playing = self._agent.response_id
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
        after = self._after_reply
        if (after.hang_up_reason is not None or after.respond) and self._agent.response_id is None:
            return after.deadline_ms(self.ledger)  # a hang-up or a tool's answer once the reply has played
        return self.ledger.next_deadline_ms()

    # ------------------------------------------------------------ agent actions

    def action_finished(self, call_id: str, result: ActionResult, now_ms: int) -> None:
        """The carrier work of ``PendingAction`` ``call_id`` is over: the model hears the result; a transfer that
        succeeded ends the call (hung up the carrier's way — SIP's BYE after the REFER — unless the call has
        left the bridge with it). Then drain every output."""
        actions = self._actions
        action = actions.finished(call_id)
        if action is not None and actions.closing_after_transfer and isinstance(action, TransferCall):
            # The stream stopped while the transfer was under way: its result decides how the call ended.
            actions.closing_after_transfer = False
            self._to_engine(FunctionCallOutput(call_id, result.output()))
            if result.ok:
                self.end_reason = "transferred"
            self._to_engine(CloseSession("transferred" if result.ok else "call_ended"))
            return
        if action is None or self.state is not CallState.LIVE:
            return  # the call ended meanwhile: nobody to tell
        self._to_engine(FunctionCallOutput(call_id, result.output()))
        if isinstance(action, ApplicationToolCall):  # the model speaks to the result: now, or after what it is saying
            if self._responding(now_ms):
                self._after_reply.respond = True
            else:
                self._to_engine(CreateResponse())
        if isinstance(action, TransferCall) and result.ok:
            self._end_by_agent("transferred", hang_up=not result.call_left)

    def tool_slow(self, call_id: str, now_ms: int) -> None:
        """The application's tool ``call_id`` has not answered yet (``app.tool_filler_after_s``): where a filler is
        configured and the agent is silent, it is told to say it (once per tool call). Then drain every output."""
        filler = self._actions.filler_due(call_id) if self.state is CallState.LIVE else None
        if filler is None or self._responding(now_ms):
            return
        self._actions.filler_said(call_id)
        self._to_engine(CreateTextItem(filler))
        self._to_engine(CreateResponse())

    def _silence_due_ms(self) -> int | None:
        """When the caller's silence next calls for something (``SilenceWatch``), or None."""
        if self.state is not CallState.LIVE or self._after_reply.hang_up_reason is not None:
            return None
        return self._silence.due_ms(self.ledger.playing_until_ms)

    def _check_silence(self, now_ms: int) -> None:
        """The caller has said nothing for long enough: the model is told to prompt them, or to say goodbye (and the
        call is hung up once that has played). Never while the agent is speaking or a reply is coming."""
        silence = self._silence
        if not silence.watching or self._after_reply.hang_up_reason is not None:
            return
        busy = self._responding(now_ms) or bool(self._actions.running)
        prompt = silence.check(now_ms, self.ledger.playing_until_ms, busy=busy)
        if prompt is None:
            return
        self._to_engine(CreateTextItem(prompt.text))
        self._to_engine(CreateResponse())
        if prompt.hang_up:
            self._after_reply.goodbye_asked(now_ms)
        self._out.append(Observed("silence", prompt.quiet_ms, detail="hang_up" if prompt.hang_up else "reprompt"))

    def _respond_when_silent(self, now_ms: int) -> None:
        """A tool's result reached the model while the agent spoke: the model answers it once that has played out
        and the engine was told so (``AfterReply.respond_due``)."""
        after = self._after_reply
        if not after.respond or self.state is not CallState.LIVE:
            return
        last, heard = after.last_response, self._heard
        told_all = last is None or heard.told(last) >= int(heard.generated_ms(last) or 0.0) - self.ledger.frame_ms
        playing_until = self.ledger.playing_until_ms
        if after.respond_due(now_ms, responding=self._responding(now_ms), told_all=told_all, playing_until_ms=playing_until):
            self._to_engine(CreateResponse())

    def _responding(self, now_ms: int) -> bool:
        """The agent's reply is arriving or playing."""
        return self._agent.response_id is not None or self.ledger.is_playing(now_ms)

    def _on_function_call(self, call: FunctionCall) -> None:
        if self._actions.function_call(call, self._out, ending=self._after_reply.hang_up_reason is not None):
            self._after_reply.end_call_asked()

    def _hang_up_when_played(self, now_ms: int) -> None:
        """``end_call`` (or a silent caller's goodbye): once the reply being received has ended and its audio has
        played, hang up."""
        reason = self._after_reply.hang_up_due(now_ms, self._agent.response_id, self.ledger)
        if reason is not None and self.state is CallState.LIVE:
            self._end_by_agent(reason, hang_up=True)

    def _end_by_agent(self, reason: str, *, hang_up: bool) -> None:
        self._transition(_Trigger.AGENT_ENDED)
        self.end_reason = reason
        self._to_engine(CloseSession(reason))
        self._actions.running.clear()
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
                self._agent.start(event.out_encoding or event.encoding, event.out_rate_hz or event.rate_hz, self.ledger.frame_ms)
            case StreamStopped():
                bound = self.state is CallState.LIVE
                self._transition(_Trigger.STOPPED)
                self.end_reason = "caller_hung_up"
                # a transfer under way: most likely the transfer's own doing (a carrier stops the stream as the transfer
                # lands); the model hears its result first (``action_finished``)
                if bound and not self._actions.stream_stopped():
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
            audio = inbound.receive(payload, timestamp_ms, now_ms)
        except MediaAhead as exc:
            raise RemoteProtocolError(
                ProtocolErrorReason.FLOOD, str(exc), provider=self.codec.provider, stream_id=self.codec.stream_id
            ) from None
        self.input_ms += inbound.payload_ms
        recorder = self.recorder
        if recorder is not None:
            recorder.caller(inbound.pcm)
            chunk = recorder.take(now_ms)
            if chunk is not None:
                self._out.append(RecordingChunk(chunk))
        if self.state is not CallState.LIVE:
            inbound.hold(audio)
            return
        if not audio:
            return
        greeting = self._greeting
        if greeting.muted_until_ms is not None and greeting.mutes(now_ms, self._agent.response_id, self.ledger):
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
        agent, response_id = self._agent, delta.response_id
        if response_id in agent.interrupted:
            self.late_deltas_dropped += 1
            return
        if response_id != agent.response_id or not agent.converting:
            if agent.response_id is not None and agent.response_id != response_id:
                self._finish_response(now_ms)
            agent.begin(response_id, delta.rate_hz)
            self._after_reply.reply_began(response_id)  # a goodbye asked for is this reply: it plays, then the hang-up
            self._greeting.reply_began(response_id)  # the first reply of a new session: the greeting
            if self._caller_stopped_ms is not None:  # the reply to the caller's turn: its first audio goes out now
                self._out.append(Observed("turn", max(0, now_ms - self._caller_stopped_ms), response_id=response_id))
                self._caller_stopped_ms = None
            self._heard.response_began()
        self._heard.generated(response_id, len(delta.pcm) * 500 / delta.rate_hz)
        self._enqueue(response_id, agent.frames(delta.pcm), now_ms)

    def _enqueue(self, response_id: str, frames: list[bytes] | None, now_ms: int) -> None:
        if frames is not None:
            self.ledger.enqueue(response_id, frames, now_ms)
        self._drain_ledger()

    def _finish_response(self, now_ms: int) -> None:
        """The response's audio is complete: drain the resampler, pad the last frame, mark its end."""
        agent, response_id = self._agent, self._agent.response_id
        if response_id is None:
            return
        if not agent.converting:  # only the last stream's rest played here
            self.ledger.end_response(response_id, now_ms)
            agent.stop()
            self._drain_ledger()
            return
        held, tail = agent.finish()
        self._enqueue(response_id, held, now_ms)
        if tail is not None:
            self.ledger.enqueue(response_id, [tail], now_ms)
        self.ledger.end_response(response_id, now_ms)
        self._drain_ledger()

    def _interrupt(self, response_id: str | None, now_ms: int) -> None:
        """Barge-in: stop the agent's audio at the carrier, tell the engine what was heard."""
        agent = self._agent
        if response_id is None or response_id in agent.interrupted:
            return
        agent.interrupted.add(response_id)
        if response_id == agent.response_id:
            agent.stop()
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
