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

Parts (each sans-I/O, with its own state; this class is their composition and the state table,
``bridge/call_state.py``): the caller's audio and the flood limit (``bridge/inbound.py``), the agent's speech — its
replies framed and paced out, barge-in, what the caller heard of each over the call (``bridge/agent_speech.py``,
over ``agent_audio.py``, ``playout.py`` and ``heard.py``), the agent's turns — greeting, silence, function calls,
what waits for a reply to play out (``bridge/agent_turns.py``, over ``turns.py`` and ``agent_actions.py``), and the
stream's limits (``bridge/limits.py``). A new behaviour is a part of its own, not more attributes here.

A carrier message that breaks the protocol ends the call: the error is kept
in ``failure`` for the driver to log, the engine session is closed, the
call hung up, the socket closed. Nothing here touches another call.
"""

from __future__ import annotations

from typing import Final

from callbridge.bridge.actions import ActionResult
from callbridge.bridge.agent_actions import AgentActions
from callbridge.bridge.agent_speech import FIRST_MARK_FRAMES, AgentSpeech
from callbridge.bridge.agent_turns import AgentTurns
from callbridge.bridge.binding import EngineBinding
from callbridge.bridge.call_options import CallOptions, DtmfMode
from callbridge.bridge.call_outputs import (
    BindEngine,
    CallOutput,
    MarkLag,
    Notice,
    Observed,
    StreamReport,
    ToEngine,
)
from callbridge.bridge.call_state import CARRIER_TRIGGERS, TRANSITIONS, CallState, CallStateError, Trigger
from callbridge.bridge.caller_audio import CallerAudio
from callbridge.bridge.carrier_link import CarrierLink
from callbridge.bridge.inbound import MediaAhead
from callbridge.bridge.lifecycle import EndReason, StreamFacts
from callbridge.bridge.limits import IDLE_TIMEOUT, StreamLimits
from callbridge.carriers.base import (
    CarrierEvent,
    CarrierNotice,
    DtmfReceived,
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
from callbridge.engine.commands import AppendAudio, CloseSession, CreateTextItem, EngineCommand
from callbridge.engine.errors import FATAL_RESUME_CODES, ErrorCode
from callbridge.engine.events import (
    EngineEvent,
    SessionClosed,
    SessionExpired,
    SessionReplaced,
)
from callbridge.engine.port import UnheardAudio

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

TAKEOVER_TELLS_HELD_MS: Final = 200
"""How long a stream that took the call over from a dead process holds what it would tell the engine of what the
caller heard (acks, truncations). The engine's replay after the live ticket comes first on its socket, at once:
it may hold a barge-in the dead stream lived through, then what that stream told of it (``playback.acknowledged``,
``conversation.item.truncated``), which this stream's estimate from an older ticket falls short of. What is held
goes once the replay is in, and only what the engine was not told already."""
_OVER: Final = (CallState.ENDED, CallState.DETACHED)
"""The stream is over: ended with the call, or its session left for the next stream."""


class CallSession:
    """One carrier stream of a call, bound to one engine session. See the module docstring."""

    def __init__(self, codec: ProviderCodec, options: CallOptions) -> None:
        self.codec = codec
        self.options = options
        self.state = CallState.AWAITING_START
        self.start_request: StreamStarted | None = None
        self.detach_engine = False
        self.end_reason: str | None = None
        self.failure: RemoteProtocolError | None = None
        self.failures_by_engine: str | None = None
        """Why the engine failed this call, if it did (the driver counts it)."""
        self.limit_reached: str | None = None
        """The limit that ended the stream (``first_message_timeout``, ``idle_timeout``, ``max_call_duration``)."""
        self._out: list[CallOutput] = []
        """Every part's outputs, in the order produced (``outputs``)."""
        self.caller = CallerAudio(options.engine_rate_hz, options.resampler_quality, self._out)
        """The caller's side: the flood limit, the caller's audio, the call's input timeline, the recording."""
        self.link = CarrierLink(codec, self._out)
        """The carrier's connection: what is sent, the hang-up the carrier's way, the socket's close."""
        self.speech = AgentSpeech(options, self._out, self.link)
        """The agent's speech: its replies paced out, barge-in, what the caller heard of each."""
        self.turns = AgentTurns(AgentActions(options.call_actions, options.transfer_targets), options.turn_silence_ms, self.speech, self._out)
        self._limits = StreamLimits(options.first_message_timeout_ms, options.idle_timeout_ms, options.max_call_ms)
        """The limits no message enforces (``bridge/limits.py``)."""
        self._unheard: UnheardAudio | None = None
        """The rest of the reply playing when the stream dropped, for the next stream (``facts``)."""

    # ------------------------------------------------------------------ inputs

    def connected(self, now_ms: int) -> None:
        """The carrier's connection is open: the limits run from now (``CallOptions``; checked by ``tick``)."""
        self._limits.connected(now_ms)

    def receive_message(self, message: str | bytes, now_ms: int) -> None:
        """One websocket message from the carrier. Then drain every output; a protocol error ends the call."""
        if self.state in _OVER:
            return  # read after the stream ended (a send failed first): nothing is listening any more
        self._limits.message_read(now_ms)
        starting = self.start_request is None
        try:
            if not self.caller.admits(now_ms, started=self.start_request is not None):
                raise RemoteProtocolError(ProtocolErrorReason.FLOOD, "more messages than a media stream sends", provider=self.codec.provider)
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
        self._transition(Trigger.ENGINE_BOUND)
        agent = binding.agent
        self.turns.bound(agent, now_ms)
        if agent.call_ends_at_ms is not None:
            self._limits.call_ends_at(agent.call_ends_at_ms)
        if agent.record:
            self.speech.ledger.recorder = self.caller.record_from(now_ms, self.speech.audio)
        self.speech.bound(binding, now_ms, hold_tells_ms=TAKEOVER_TELLS_HELD_MS)
        self.caller.bound(binding.call_offset_ms)
        for audio in self.caller.inbound.release():
            self._to_engine(AppendAudio(audio, self.options.engine_rate_hz))
        self.turns.greet(agent, now_ms)
        if binding.unheard is not None:
            self.speech.play_unheard(binding.unheard, now_ms)
        self.tick(now_ms)

    def start_refused(self, reason: str) -> None:
        """The stream may not be bridged (someone else's token, a call already over, no registry): close it, touch
        nothing else (a stream that ended meanwhile is left as it ended). No engine for the call: ``no_engine``."""
        if self.state is not CallState.STARTING:
            return
        self._end(Trigger.START_REFUSED, reason)

    def receive_engine_event(self, event: EngineEvent, now_ms: int) -> None:
        """One event of the call's engine session. Then drain every output."""
        if self.state is not CallState.LIVE:
            return
        speech, turns = self.speech, self.turns
        if not speech.admits(event):  # audio of a cancelled response or an older epoch
            return
        handled = speech.on_event(event, now_ms, turns) or turns.on_event(event, self.caller.input_ms, now_ms)
        if handled:
            pass  # the agent's speech or turns took it
        elif isinstance(event, (SessionClosed, SessionExpired)):
            reason = f"engine_{type(event).__name__}:{event.reason}"
            if isinstance(event, SessionExpired) or _is_engine_failure(event.reason):
                self.engine_failed(reason, now_ms)
            else:
                self._end(Trigger.ENGINE_ENDED, reason, hang_up=True)
        elif isinstance(event, SessionReplaced):  # a newer stream took the session over (this one was taken for
            self._transition(Trigger.REPLACED)  # dead): it ends quietly, the call not over, nothing to detach
            self.end_reason = "session_replaced"
            self.link.drop_messages()
            self.link.going_away = True
            self._close_transport()
        # anything else (an engine error: the driver logs it) does not end the call
        self._agent_turns_due(now_ms)

    def engine_failed(self, reason: str, now_ms: int) -> None:
        """The engine session failed (expired, lost past resume, an engine error): the caller hears a short
        fallback tone instead of silence, then the call is hung up. Agent audio still queued is dropped."""
        if self.state is not CallState.LIVE:
            return
        self.failures_by_engine = reason
        self.speech.silence(now_ms)
        self._end_with_tone(reason, now_ms)

    def no_engine(self, reason: str, now_ms: int) -> None:
        """No engine session can be had for the stream (none opens, the parked one is gone): the caller hears the
        fallback tone, not silence, then the call is hung up the carrier's way. The caller's buffered audio goes."""
        if self.state is not CallState.STARTING:
            return
        self.caller.inbound.drop_held()
        self._end_with_tone(reason, now_ms)

    def shut_down(self, now_ms: int) -> None:
        """The process stops with the call still up (a lone process whose drain ran out): the engine is told what
        the caller heard and its session is closed; the caller hears the closing tone, then the carrier's hang-up
        — not a silent drop."""
        if self.state is not CallState.LIVE:
            return
        self.speech.stop_playback(None, now_ms, barge_in=False)
        self._to_engine(CloseSession(EndReason.BRIDGE_SHUTDOWN))
        self._end_with_tone(EndReason.BRIDGE_SHUTDOWN, now_ms)

    def _end_with_tone(self, reason: str, now_ms: int) -> None:
        """ENDING for ``reason``: no more agent audio; the fallback tone is queued (``tick`` hangs up once it has
        played; at once without one)."""
        self._transition(Trigger.ENGINE_FAILED)
        self.end_reason = reason
        self.speech.play_tone(self.options.failure_tone_ms, now_ms)
        self.tick(now_ms)

    def end_call(self, reason: str, now_ms: int) -> None:
        """The bridge ends the call (a limit was reached): the engine session is closed, the call hung up the
        carrier's way (if it was bridged), the socket closed."""
        if self.state in _OVER:
            return
        bridged = self.state in (CallState.LIVE, CallState.ENDING)
        if self.state is CallState.LIVE:
            self._to_engine(CloseSession(reason))
        self.state = TRANSITIONS[(self.state, Trigger.FAILED)]
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
        if self.state in _OVER:
            return
        self._fail(self._protocol_error(ProtocolErrorReason.OVERSIZED, detail))

    def transport_lost(self, now_ms: int) -> None:
        """The carrier's socket closed without ``stop``: keep the engine session for the next stream.

        Whatever the caller had not heard yet is gone with the socket: the engine is told what was heard
        (ack, truncate), as for a barge-in, before the session is detached; the rest of the reply, where it is
        short, is kept for the next stream to play first (``AgentSpeech.unheard_at_drop``).
        """
        if self.state in _OVER:
            return
        bound = self.state is CallState.LIVE
        if bound:
            self._unheard = self.speech.unheard_at_drop(now_ms)
        self._transition(Trigger.TRANSPORT_LOST)
        self.end_reason = "transport_lost"
        self.detach_engine = bound
        self.link.drop_messages()  # nowhere to send them

    def send_failed(self, now_ms: int) -> None:
        """A send to the carrier failed: its side is closed. Nothing more is played (or sent); what the carrier sent
        before it closed (a ``stop`` after a hang-up) may still be read. If no ``stop`` comes by
        ``SEND_FAILED_READ_MS`` (``bridge/carrier_link.py``), ``tick`` takes the stream for dropped (its session kept
        for the next stream); meanwhile engine events are left untaken (``takes_engine_events``), for that stream to
        have."""
        if self.state not in _OVER:
            self.link.send_failed(now_ms)

    @property
    def takes_engine_events(self) -> bool:
        """Whether ``receive_engine_event`` takes events now: a live stream whose carrier still listens."""
        return self.state is CallState.LIVE and self.link.send_failed_at_ms is None

    @property
    def close_code(self) -> int:
        """The close code of the carrier's connection when ``close_transport``: a policy violation for a protocol
        error or someone else's token; going away for a stream moved or superseded (no ``stop``: the carrier
        reconnects); else normal. (A moved stream's socket is closed by the driver, with this code, after its
        session is parked.)"""
        return self.link.close_code(policy_violation=self.failure is not None or self.end_reason == EndReason.BAD_TOKEN)

    def superseded(self, now_ms: int) -> None:
        """A newer stream of the call has come (this one's socket is half-open, or slow to notice its drop): end
        this one as a drop, its session kept for the newer stream, and close its socket."""
        if self.state in _OVER:
            return
        self.transport_lost(now_ms)
        self.link.going_away = True
        self._close_transport()

    def move_elsewhere(self, now_ms: int) -> bool:
        """The process is draining: end this stream as a network drop would, so the carrier's reconnect (its
        redirect) resumes the call on another process; what the caller heard goes to the engine first, and
        the socket is closed going away (no ``stop``). False, and nothing done, for a stream not live or a carrier
        that does not reconnect (``HangUpMode.CLOSE``: closing its socket would end the call; it runs to its end)."""
        if self.codec.profile.hang_up is HangUpMode.CLOSE or self.state is not CallState.LIVE:
            return False
        self.transport_lost(now_ms)
        self.link.going_away = True  # closed by the driver once the session is parked, so the next stream finds it
        return True

    def action_finished(self, call_id: str, result: ActionResult, now_ms: int) -> None:
        """The carrier work of ``PendingAction`` ``call_id`` is over: the model hears the result; a transfer that
        succeeded ends the call (hung up the carrier's way — SIP's BYE after the REFER — unless the call has
        left the bridge with it). Then drain every output."""
        live = self.state is CallState.LIVE
        transferred = self.turns.action_finished(call_id, result, now_ms, live=live)
        if transferred is not None and live:
            self._end_by_agent("transferred", hang_up=transferred.hang_up)
        elif transferred is not None:  # the stream stopped while the transfer was under way: it decides the end
            self.end_reason = "transferred"

    def tool_slow(self, call_id: str, now_ms: int) -> None:
        """The application's tool ``call_id`` has not answered yet (``app.tool_filler_after_s``): where a filler is
        configured and the agent is silent, it is told to say it (once per tool call). Then drain every output."""
        if self.state is CallState.LIVE:
            self.turns.tool_slow(call_id, now_ms)

    def tick(self, now_ms: int) -> None:
        """Pace out the frames that are due; end a stream past a limit. Drain ``outputs`` next. On a tick far later
        than the deadline it answers (``PROCESS_STALL_MS``: this process did not run meanwhile, and the tick runs
        before the reader gets to the carrier's messages of that time) the carrier's limits (idle, first message)
        are judged that much later, once the reader has had its turn."""
        limits, speech = self._limits, self.speech
        if limits.is_due(now_ms) and not limits.deferred:
            limits.put_off_if_late(now_ms, self.next_deadline_ms())
        read_until_ms = self.link.read_until_ms()
        if read_until_ms is not None:  # nothing reaches the carrier: no frame into the void
            if now_ms >= read_until_ms and self.state not in _OVER:
                self.transport_lost(now_ms)
                self._close_transport()  # its receive may not see the close: closing wakes it
            return
        if limits.is_due(now_ms):
            self._check_limits(now_ms)
        held_until = speech.heard.held_until_ms
        if held_until is not None and now_ms >= held_until:
            speech.release_held_tells()
        if self.state is CallState.LIVE:
            speech.ledger.tick(now_ms)
            speech.drain()
            self._agent_turns_due(now_ms)
            self.turns.check_silence(now_ms)
        elif self.state is CallState.ENDING:
            speech.ledger.tick(now_ms)
            speech.drain(to_engine=False)
            if not speech.ledger.is_playing(now_ms):  # the fallback has played out: now hang up
                self._transition(Trigger.FALLBACK_PLAYED)
                self._hang_up(self.end_reason or "engine_failed")

    def _agent_turns_due(self, now_ms: int) -> None:
        """What waited for the agent's reply to play out: the hang-up asked for, a tool's result to answer."""
        turns = self.turns
        after = turns.after_reply  # looked at here first: on every event and tick, mostly nothing waits
        if after.hang_up_reason is not None:
            reason = turns.hang_up_due(now_ms)
            if reason is not None and self.state is CallState.LIVE:
                self._end_by_agent(reason, hang_up=True)
        if after.respond and self.state is CallState.LIVE:
            turns.respond_when_silent(now_ms)

    # ----------------------------------------------------------------- reports

    @property
    def finished(self) -> bool:
        """The stream is over: ended with the call, or its session left for the next stream."""
        return self.state in _OVER

    def facts(self) -> StreamFacts:
        """What the stream's ``CallLifecycle`` needs of it, now."""
        return StreamFacts(
            awaiting_engine=self.state is CallState.STARTING,
            call_over=self.state is CallState.ENDED,
            end_reason=self.end_reason,
            detach=self.detach_engine,
            input_ms=self.caller.input_ms,
            heard_ms=self.speech.heard.cut_replies,  # for the next stream, through the resume ticket
            unheard=self._unheard,
            told_ms=self.told_so_far,
        )

    def report(self) -> StreamReport:
        """The stream's account of itself, as it ends."""
        ledger = self.speech.ledger
        return StreamReport(
            facts=self.facts(),
            limit_reached=self.limit_reached,
            engine_failure=self.failures_by_engine,
            failure=self.failure,
            stream_input_ms=self.caller.inbound.stream_media_ms,
            output_ms=ledger.frames_sent * ledger.frame_ms,
            frames_sent=ledger.frames_sent,
            frames_flushed=ledger.frames_dropped,
            barge_ins=self.speech.flushes,
            late_deltas_dropped=self.speech.late_deltas_dropped,
            heard_corrections=ledger.corrections,
            playout_underruns=ledger.underruns,
        )

    @property
    def told_so_far(self) -> tuple[tuple[str, int], ...]:
        """For the call's next stream (its ticket's ``told_ms``, live or parked): the most the engine was told the
        caller heard of each recent response."""
        return self.speech.heard.told_so_far

    def heard_so_far(self, now_ms: int) -> tuple[tuple[str, int], ...]:
        """For the stream's live ticket (a stream that takes the call over from it, should this process die): the
        cut-off replies (``facts().heard_ms``) and the reply still being generated, with what the caller has heard of
        it so far; that stream's acks of it count on from there."""
        return self.speech.heard_so_far(now_ms, live=self.state is CallState.LIVE)

    # ----------------------------------------------------------------- outputs

    def outputs(self) -> list[CallOutput]:
        """Everything the call produced since the last call, in the order it was produced: do each in turn."""
        out = self._out[:]  # the queue is shared with the parts: taken by copy, not swapped
        self._out.clear()
        lags = self.speech.ledger.mark_lags_ms
        if lags:  # a marker echo every few frames, not every frame
            out.extend(MarkLag(lag_ms) for lag_ms in lags)
            lags.clear()
        return out

    def next_deadline_ms(self) -> int | None:
        read_until_ms = self.link.read_until_ms()
        if read_until_ms is not None:
            return None if self.state in _OVER else read_until_ms
        playout: int | None
        if self.state is CallState.ENDING:  # the next frame of the fallback, or the moment it has played out
            playout = self.speech.ledger.next_deadline_ms() or self.speech.ledger.playing_until_ms
        else:
            playout = self.turns.playout_deadline_ms() if self.state is CallState.LIVE else None
        limits = self._limits.due_ms if self.state not in _OVER else None
        silence = self.turns.silence_due_ms() if self.state is CallState.LIVE else None
        due = [deadline for deadline in (playout, limits, self.speech.heard.held_until_ms, silence) if deadline is not None]
        return min(due) if due else None

    def _to_engine(self, command: EngineCommand) -> None:
        self._out.append(ToEngine(command))

    def _close_transport(self) -> None:
        self.link.close(self.close_code)

    def _hang_up(self, reason: str) -> None:
        """End the phone call the carrier's way (REST by the driver, in band, or by closing), then the socket."""
        self.link.hang_up(reason)
        self._close_transport()

    def _end_by_agent(self, reason: str, *, hang_up: bool) -> None:
        self.turns.actions.running.clear()
        self._end(Trigger.AGENT_ENDED, reason, close_session=True, hang_up=hang_up)

    def _end(self, trigger: Trigger, reason: str, *, close_session: bool = False, hang_up: bool = False) -> None:
        """The stream ends for ``reason``: the engine session closed (``close_session``), the call hung up the
        carrier's way (``hang_up``), the socket closed."""
        self._transition(trigger)
        self.end_reason = reason
        if close_session:
            self._to_engine(CloseSession(reason))
        if hang_up:
            self._hang_up(reason)
        self._close_transport()

    def _check_limits(self, now_ms: int) -> None:
        """The limits no message enforces (``StreamLimits``): a connection that never starts its stream, a stream
        past the longest call (ended), a stream gone quiet (taken as dropped: the session waits for the next one)."""
        if self.state in _OVER:
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

    # ------------------------------------------------------------- carrier side

    def _on_carrier_event(self, event: CarrierEvent, now_ms: int) -> None:
        match event:
            case MediaReceived(payload, timestamp_ms):
                self._transition(Trigger.CARRIER_EVENT)
                self._on_media(payload, timestamp_ms, now_ms)
            case MarkEchoed(name):
                self._transition(Trigger.CARRIER_EVENT)
                # when it arrived, as far as we know: read late in a backlog, it says nothing of the carrier
                self.speech.ledger.mark_echoed(name, now_ms - self.caller.inbound.read_lag_ms)
                self.speech.drain(to_engine=self.state is CallState.LIVE)  # not the failure tone's
                if self.state is CallState.LIVE:
                    self.turns.respond_when_silent(now_ms)
            case DtmfReceived(digit):
                self._transition(Trigger.CARRIER_EVENT)
                self._out.append(Notice(event))
                self._out.append(Observed("dtmf", detail=digit))
                if self.options.dtmf_mode is DtmfMode.TEXT_ITEM and self.state is CallState.LIVE:
                    self._to_engine(CreateTextItem(f"DTMF {digit}"))
            case StreamStarted():
                self._transition(Trigger.STARTED)
                self.start_request = event
                self.caller.inbound.start(event.encoding, event.rate_hz)
                self.speech.start(self.codec.profile, event.out_encoding or event.encoding, event.out_rate_hz or event.rate_hz)
            case StreamStopped():
                bound = self.state is CallState.LIVE
                self._transition(Trigger.STOPPED)
                self.end_reason = "caller_hung_up"
                # a transfer under way: most likely the transfer's own doing (a carrier stops the stream as the transfer
                # lands); the model hears its result first (``action_finished``)
                if bound and not self.turns.actions.stream_stopped():
                    self._to_engine(CloseSession("call_ended"))
                self._close_transport()
            case StreamConnected():
                self._transition(Trigger.CONNECTED)
            case PlaybackCleared():
                self._transition(Trigger.CARRIER_EVENT)
            case CarrierNotice() | UnknownCarrierEvent():
                self._out.append(Notice(event))

    def _on_media(self, payload: bytes, timestamp_ms: int | None, now_ms: int) -> None:
        if self.state is CallState.ENDING:
            return  # no engine to hear it
        try:
            audio = self.caller.receive(payload, timestamp_ms, now_ms)
        except MediaAhead as exc:
            raise self._protocol_error(ProtocolErrorReason.FLOOD, str(exc)) from None
        if self.state is not CallState.LIVE:
            self.caller.inbound.hold(audio)
        elif audio:
            if self.turns.greeting.muted_until_ms is not None and self.turns.mutes_caller(now_ms):
                audio = bytes(len(audio))  # the caller's words over a greeting that may not be cut: not heard
            self._to_engine(AppendAudio(audio, self.options.engine_rate_hz))

    def _protocol_error(self, reason: ProtocolErrorReason, detail: str) -> RemoteProtocolError:
        return RemoteProtocolError(reason, detail, provider=self.codec.provider, stream_id=self.codec.stream_id)

    # ------------------------------------------------------------------- state

    def _transition(self, trigger: Trigger) -> None:
        if trigger is Trigger.CARRIER_EVENT and self.state is CallState.LIVE:
            return  # every media frame of a live call: (LIVE, CARRIER_EVENT) → LIVE without hashing enums
        try:
            self.state = TRANSITIONS[(self.state, trigger)]
        except KeyError:
            if trigger in CARRIER_TRIGGERS:
                raise self._protocol_error(ProtocolErrorReason.OUT_OF_ORDER, f"{trigger.value} while {self.state.value}") from None
            raise CallStateError(f"{trigger.value} while {self.state.value}") from None
        heard = self.speech.heard
        if heard.held_until_ms is not None and self.state is not CallState.LIVE:
            if trigger is Trigger.REPLACED:  # the session is another stream's now: nothing of it is this one's to tell
                heard.drop_held()
            else:  # the stream ends before the replay is in: what it holds goes now or never
                self.speech.release_held_tells()

    def _fail(self, exc: RemoteProtocolError) -> None:
        bound = self.state is CallState.LIVE
        self.failure = exc
        self.state = TRANSITIONS[(self.state, Trigger.FAILED)]
        self.end_reason = f"protocol_error:{exc.reason.value}"
        if bound:
            self._to_engine(CloseSession("carrier_protocol_error"))
        if self.start_request is not None:  # a known call, bound or being bound: it ends, the carrier's way
            self._hang_up(self.end_reason)
        self._close_transport()


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
