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
what waits for a reply to play out (``bridge/agent_turns.py``, over ``turns.py`` and ``agent_actions.py``), the
stream's limits (``bridge/limits.py``), and its phase with the account of its end — what ending does to the engine
session, the call and the socket (``bridge/stream_phase.py``). A new behaviour is a part of its own, not more
attributes here.

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
from callbridge.bridge.bridge_barge_in import barge_in_decider
from callbridge.bridge.call_options import CallOptions, DtmfMode
from callbridge.bridge.call_outputs import (
    BindEngine,
    CallOutput,
    Notice,
    Observed,
    StreamReport,
    ToEngine,
)
from callbridge.bridge.call_state import TRANSITIONS, CallState, CallStateError, Trigger
from callbridge.bridge.caller_audio import CallerAudio
from callbridge.bridge.carrier_link import CarrierLink
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.inbound import MediaAhead
from callbridge.bridge.lifecycle import StreamFacts
from callbridge.bridge.limits import StreamLimits
from callbridge.bridge.stream_phase import OVER, StreamPhase
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
class CallSession:
    """One carrier stream of a call, bound to one engine session. See the module docstring."""

    def __init__(self, codec: ProviderCodec, options: CallOptions) -> None:
        self.codec = codec
        self.options = options
        self.start_request: StreamStarted | None = None
        self._out: list[CallOutput] = []
        """Every part's outputs, in the order produced (``outputs``)."""
        self.caller = CallerAudio(options.engine_rate_hz, options.resampler_quality, self._out)
        """The caller's side: the flood limit, the caller's audio, the call's input timeline, the recording."""
        self.link = CarrierLink(codec, self._out)
        """The carrier's connection: what is sent, the hang-up the carrier's way, the socket's close."""
        self.speech = AgentSpeech(options, self._out, self.link)
        """The agent's speech: its replies paced out, barge-in, what the caller heard of each."""
        self.phase = StreamPhase(self.link, self.speech, self._out, self._protocol_error)
        """The stream's phase in the transition table, how it ended and what ending does (``bridge/stream_phase.py``)."""
        self.turns = AgentTurns(AgentActions(options.call_actions, options.transfer_targets), options.turn_silence_ms, self.speech, self._out)
        self._limits = StreamLimits(options.first_message_timeout_ms, options.idle_timeout_ms, options.max_call_ms)
        """The limits no message enforces (``bridge/limits.py``)."""
        self.barge_in = barge_in_decider(options.engine_rate_hz, options.barge_in)

    @property
    def state(self) -> CallState:
        return self.phase.state

    # ------------------------------------------------------------------ inputs

    def connected(self, now_ms: int) -> None:
        """The carrier's connection is open: the limits run from now (``CallOptions``; checked by ``tick``)."""
        self._limits.connected(now_ms)

    def receive_message(self, message: str | bytes, now_ms: int) -> None:
        """One websocket message from the carrier. Then drain every output; a protocol error ends the call."""
        if self.phase.state in OVER:
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
            if self.phase.state is CallState.STARTING:  # not ended in the same read (a start and its stop)
                self._out.append(BindEngine(self.start_request))

    def engine_bound(self, binding: EngineBinding, now_ms: int) -> None:
        """The engine session for ``start_request`` is open (or resumed): audio flows from now on. ``binding``: the
        session (its capabilities, where a resumed call left off) and what the call's agent does on this stream."""
        self.phase.go(Trigger.ENGINE_BOUND)
        agent = binding.agent
        self.turns.bound(agent, now_ms, rate_hz=self.options.engine_rate_hz)
        self._limits.call_ends_at(agent.call_ends_at_ms)
        self.barge_in = barge_in_decider(self.options.engine_rate_hz, agent.barge_in) if agent.barge_in else self.barge_in  # its assistant's
        if agent.record:
            self.speech.ledger.recorder = self.caller.record_from(now_ms, self.speech.audio)
        self.speech.bound(binding, now_ms, hold_tells_ms=TAKEOVER_TELLS_HELD_MS)
        self.caller.bound(binding.call_offset_ms)
        for audio in self.caller.inbound.release():
            if not self._answer_took(audio, now_ms):
                self._to_engine(AppendAudio(audio, self.options.engine_rate_hz))
        if self.phase.state is not CallState.LIVE:
            return  # a machine, hung up on already
        self.turns.greet(agent, now_ms)
        if binding.unheard is not None:
            self.speech.play_unheard(binding.unheard, now_ms)
        self.tick(now_ms)

    def start_refused(self, reason: EndCause) -> None:
        """The stream may not be bridged (someone else's token, a call already over, no registry): close it, touch
        nothing else (a stream that ended meanwhile is left as it ended). No engine for the call: ``no_engine``."""
        if self.phase.state is not CallState.STARTING:
            return
        self.phase.end(Trigger.START_REFUSED, reason)

    def receive_engine_event(self, event: EngineEvent, now_ms: int) -> None:
        """One event of the call's engine session. Then drain every output."""
        if self.phase.state is not CallState.LIVE:
            return
        speech, turns = self.speech, self.turns
        if not speech.admits(event):  # audio of a cancelled response or an older epoch
            return
        handled = speech.on_event(event, now_ms, turns) or turns.on_event(event, self.caller.input_ms, now_ms)
        if handled:
            pass  # the agent's speech or turns took it
        elif isinstance(event, (SessionClosed, SessionExpired)):
            reason = _session_end(event)
            if isinstance(event, SessionExpired) or _is_engine_failure(event.reason):
                self.engine_failed(reason, now_ms)
            else:
                self.phase.end(Trigger.ENGINE_ENDED, reason, hang_up=True)
        elif isinstance(event, SessionReplaced):  # a newer stream took the session over (this one was taken for
            self.phase.replaced()  # dead): it ends quietly
        # anything else (an engine error: the driver logs it) does not end the call
        self._agent_turns_due(now_ms)

    def engine_failed(self, reason: EndCause, now_ms: int) -> None:
        """The engine session failed (expired, lost past resume, an engine error): the caller hears a short
        fallback tone instead of silence, then the call is hung up. Agent audio still queued is dropped."""
        if self.phase.state is not CallState.LIVE:
            return
        self.phase.engine_failure = reason
        self.speech.silence(now_ms)
        self._end_with_tone(reason, now_ms)

    def no_engine(self, reason: EndCause, now_ms: int) -> None:
        """No engine session can be had for the stream (none opens, the parked one is gone): the caller hears the
        fallback tone, not silence, then the call is hung up the carrier's way. The caller's buffered audio goes."""
        if self.phase.state is not CallState.STARTING:
            return
        self.caller.inbound.drop_held()
        self._end_with_tone(reason, now_ms)

    def shut_down(self, now_ms: int) -> None:
        """The process stops with the call still up (a lone process whose drain ran out): the engine is told what
        the caller heard and its session is closed; the caller hears the closing tone, then the carrier's hang-up
        — not a silent drop."""
        if self.phase.state is not CallState.LIVE:
            return
        self.speech.stop_playback(None, now_ms, barge_in=False)
        self._to_engine(CloseSession(EndReason.BRIDGE_SHUTDOWN))
        self._end_with_tone(EndCause(EndReason.BRIDGE_SHUTDOWN), now_ms)

    def _end_with_tone(self, reason: EndCause, now_ms: int) -> None:
        """ENDING for ``reason``: no more agent audio, the fallback tone queued (``tick`` hangs up once it played)."""
        self.phase.go(Trigger.ENGINE_FAILED)
        self.phase.reason = reason
        self.speech.play_tone(self.options.failure_tone_ms, now_ms)
        self.tick(now_ms)

    def end_call(self, reason: EndCause, now_ms: int) -> None:
        """The bridge ends the call (a limit was reached): the engine session is closed, the call hung up the
        carrier's way (if it was bridged), the socket closed."""
        if self.phase.state not in OVER:
            self.phase.end_call(reason)

    def carrier_ended(self, reason: EndCause, now_ms: int) -> None:
        """The carrier said out of band (a webhook) that the call is over: as its ``stop`` would."""
        if self.phase.state in (CallState.AWAITING_START, CallState.ENDED, CallState.DETACHED):
            return
        self._on_carrier_event(StreamStopped(), now_ms)
        self.phase.reason = reason

    def carrier_digit(self, digit: str, now_ms: int) -> None:
        """The carrier said out of band (a webhook) that the caller pressed ``digit``: as its DTMF event would."""
        if self.phase.state is not CallState.LIVE:
            return  # before the stream started, or after it ended: no call to hear it
        self._on_carrier_event(DtmfReceived(digit), now_ms)

    def message_refused(self, detail: str) -> None:
        """The transport refused a carrier message before reading it (over the websocket's size limit, closed
        1009): bad input, as if the codec had refused it — the stream ends, its call the carrier's way."""
        if self.phase.state in OVER:
            return
        self._fail(self._protocol_error(ProtocolErrorReason.OVERSIZED, detail))

    def transport_lost(self, now_ms: int) -> None:
        """The carrier's socket closed without ``stop``: the engine session is kept for the next stream, told what
        the caller heard (as for a barge-in); the rest of the reply, where short, is kept for the next stream to play
        first (``AgentSpeech.unheard_at_drop``)."""
        if self.phase.state in OVER:
            return
        bound = self.phase.state is CallState.LIVE
        if bound:
            self.phase.unheard = self.speech.unheard_at_drop(now_ms)
        self.phase.go(Trigger.TRANSPORT_LOST)
        self.phase.reason = EndCause(EndReason.TRANSPORT_LOST)
        self.phase.detach = bound
        self.link.drop_messages()  # nowhere to send them

    def send_failed(self, now_ms: int) -> None:
        """A send to the carrier failed: nothing more is sent; its ``stop`` may still be read. None by
        ``SEND_FAILED_READ_MS`` (``bridge/carrier_link.py``): ``tick`` takes the stream for dropped, its session and
        the engine's events meanwhile (``takes_engine_events``) kept for the next stream."""
        if self.phase.state not in OVER:
            self.link.send_failed(now_ms)

    @property
    def takes_engine_events(self) -> bool:
        """Whether ``receive_engine_event`` takes events now: a live stream whose carrier still listens."""
        return self.phase.state is CallState.LIVE and self.link.send_failed_at_ms is None

    @property
    def close_code(self) -> int:
        """The carrier connection's close code (``StreamPhase.close_code``); a moved stream's, used by the driver."""
        return self.phase.close_code

    def superseded(self, now_ms: int) -> None:
        """A newer stream of the call has come (this one's socket is half-open, or slow to notice its drop): end
        this one as a drop, its session kept for the newer stream, and close its socket."""
        if self.phase.state in OVER:
            return
        self.transport_lost(now_ms)
        self.link.going_away = True
        self.phase.close_transport()

    def move_elsewhere(self, now_ms: int) -> bool:
        """The process is draining: end this stream as a network drop would, so the carrier's reconnect (its
        redirect) resumes the call on another process; what the caller heard goes to the engine first, and
        the socket is closed going away (no ``stop``). False, and nothing done, for a stream not live or a carrier
        that does not reconnect (``HangUpMode.CLOSE``: closing its socket would end the call; it runs to its end)."""
        if self.codec.profile.hang_up is HangUpMode.CLOSE or self.phase.state is not CallState.LIVE:
            return False
        self.transport_lost(now_ms)
        self.link.going_away = True  # closed by the driver once the session is parked, so the next stream finds it
        return True

    def action_finished(self, call_id: str, result: ActionResult, now_ms: int) -> None:
        """The carrier work of ``PendingAction`` ``call_id`` is over: the model hears the result; a transfer that
        succeeded ends the call (hung up the carrier's way — SIP's BYE after the REFER — unless the call has
        left the bridge with it). Then drain every output."""
        live = self.phase.state is CallState.LIVE
        transferred = self.turns.action_finished(call_id, result, now_ms, live=live)
        if transferred is not None and live:
            self._end_by_agent(EndCause(EndReason.TRANSFERRED), hang_up=transferred.hang_up)
        elif transferred is not None:  # the stream stopped while the transfer was under way: it decides the end
            self.phase.reason = EndCause(EndReason.TRANSFERRED)

    def tool_slow(self, call_id: str, now_ms: int) -> None:
        """The application's tool ``call_id`` has not answered yet (``app.tool_filler_after_s``): where a filler is
        configured and the agent is silent, it is told to say it (once per tool call). Then drain every output."""
        if self.phase.state is CallState.LIVE:
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
            if now_ms >= read_until_ms and self.phase.state not in OVER:
                self.transport_lost(now_ms)
                self.phase.close_transport()  # its receive may not see the close: closing wakes it
            return
        if limits.is_due(now_ms):  # a look at the limits only when one is due: this runs every frame
            reached = limits.reached(now_ms, started=self.start_request is not None, over=self.phase.state in OVER)
            if reached is not None:
                self._limit_reached(reached, now_ms)
        held_until = speech.heard.held_until_ms
        if held_until is not None and now_ms >= held_until:
            speech.release_held_tells()
        if self.phase.state is CallState.LIVE:
            speech.ledger.tick(now_ms)
            speech.drain()
            self._agent_turns_due(now_ms)
            self.turns.check_silence(now_ms)
        elif self.phase.state is CallState.ENDING:
            self.phase.play_out_fallback(now_ms)

    def _agent_turns_due(self, now_ms: int) -> None:
        """What waited for the agent's reply to play out (``AgentTurns.reply_played``); mostly nothing: read first."""
        after = self.turns.after_reply
        if after.hang_up_reason is None and not after.respond:
            return
        reason = self.turns.reply_played(now_ms, live=self.phase.state is CallState.LIVE)
        if reason is not None:
            self._end_by_agent(EndCause(reason), hang_up=True)

    # ----------------------------------------------------------------- reports

    @property
    def finished(self) -> bool:
        """The stream is over: ended with the call, or its session left for the next stream."""
        return self.phase.state in OVER

    def facts(self) -> StreamFacts:
        """What the stream's ``CallLifecycle`` needs of it, now."""
        return self.phase.facts(self.caller, self.speech)

    def report(self) -> StreamReport:
        """The stream's account of itself, as it ends."""
        return self.phase.report(self.caller, self.speech)

    @property
    def told_so_far(self) -> tuple[tuple[str, int], ...]:
        """For the next stream's ticket (``told_ms``): the most the engine was told was heard of each response."""
        return self.speech.heard.told_so_far

    # ----------------------------------------------------------------- outputs

    def outputs(self) -> list[CallOutput]:
        """Everything the call produced since the last call, in the order it was produced: do each in turn."""
        out = self._out[:]  # the queue is shared with the parts: taken by copy, not swapped
        self._out.clear()
        return self.speech.with_mark_lags(out)

    def next_deadline_ms(self) -> int | None:
        read_until_ms = self.link.read_until_ms()
        if read_until_ms is not None:
            return None if self.phase.state in OVER else read_until_ms
        playout: int | None
        if self.phase.state is CallState.ENDING:  # the next frame of the fallback, or the moment it has played out
            playout = self.speech.ledger.next_deadline_ms() or self.speech.ledger.playing_until_ms
        else:
            playout = self.turns.playout_deadline_ms() if self.phase.state is CallState.LIVE else None
        limits = self._limits.due_ms if self.phase.state not in OVER else None
        silence = self.turns.silence_due_ms() if self.phase.state is CallState.LIVE else None
        due = [deadline for deadline in (playout, limits, self.speech.heard.held_until_ms, silence) if deadline is not None]
        return min(due) if due else None

    def _to_engine(self, command: EngineCommand) -> None:
        self._out.append(ToEngine(command))

    def _end_by_agent(self, reason: EndCause, *, hang_up: bool) -> None:
        self.turns.actions.running.clear()
        self.phase.end(Trigger.AGENT_ENDED, reason, close_session=True, hang_up=hang_up)

    def _limit_reached(self, reached: EndReason, now_ms: int) -> None:
        """A limit no message enforces (``StreamLimits``): a connection that never starts its stream, a stream past
        the longest call (ended), a stream gone quiet (taken as dropped: the session waits for the next one)."""
        self.phase.limit_reached = reached
        if reached is not EndReason.IDLE_TIMEOUT:
            self.end_call(EndCause(reached), now_ms)
            return
        self.transport_lost(now_ms)
        self.phase.reason = EndCause(reached)
        self.phase.close_transport()  # the socket may still be open (half-open): close it

    # ------------------------------------------------------------- carrier side

    def _on_carrier_event(self, event: CarrierEvent, now_ms: int) -> None:
        match event:
            case MediaReceived(payload, timestamp_ms):
                self.phase.go(Trigger.CARRIER_EVENT)
                self._on_media(payload, timestamp_ms, now_ms)
            case MarkEchoed(name):
                self.phase.go(Trigger.CARRIER_EVENT)
                # when it arrived, as far as we know: read late in a backlog, it says nothing of the carrier
                self.speech.ledger.mark_echoed(name, now_ms - self.caller.inbound.read_lag_ms)
                self.speech.drain(to_engine=self.phase.state is CallState.LIVE)  # not the failure tone's
                if self.phase.state is CallState.LIVE:
                    self.turns.respond_when_silent(now_ms)
            case DtmfReceived(digit):
                self.phase.go(Trigger.CARRIER_EVENT)
                self._out.append(Notice(event))
                self._out.append(Observed("dtmf", detail=digit))
                if self.options.dtmf_mode is DtmfMode.TEXT_ITEM and self.phase.state is CallState.LIVE:
                    self._to_engine(CreateTextItem(f"DTMF {digit}"))
            case StreamStarted():
                self.phase.go(Trigger.STARTED)
                self.start_request = event
                self.caller.inbound.start(event.encoding, event.rate_hz)
                self.speech.start(self.codec.profile, event.out_encoding or event.encoding, event.out_rate_hz or event.rate_hz)
            case StreamStopped():
                bound = self.phase.state is CallState.LIVE
                self.phase.go(Trigger.STOPPED)
                self.phase.reason = EndCause(EndReason.CALLER_HUNG_UP)
                # a transfer under way: most likely the transfer's own doing (a carrier stops the stream as the transfer
                # lands); the model hears its result first (``action_finished``)
                if bound and not self.turns.actions.stream_stopped():
                    self._to_engine(CloseSession("call_ended"))
                self.phase.close_transport()
            case StreamConnected():
                self.phase.go(Trigger.CONNECTED)
            case PlaybackCleared():
                self.phase.go(Trigger.CARRIER_EVENT)
            case CarrierNotice() | UnknownCarrierEvent():
                self._out.append(Notice(event))

    def _on_media(self, payload: bytes, timestamp_ms: int | None, now_ms: int) -> None:
        if self.phase.state is CallState.ENDING:
            return  # no engine to hear it
        try:
            audio = self.caller.receive(payload, timestamp_ms, now_ms)
        except MediaAhead as exc:
            raise self._protocol_error(ProtocolErrorReason.FLOOD, str(exc)) from None
        if self.phase.state is not CallState.LIVE:
            self.caller.inbound.hold(audio)
        elif audio:
            if self.turns.answer_gate is not None and self._answer_took(audio, now_ms):
                return  # a placed call's callee, while who answered is not known
            if self.turns.greeting.muted_until_ms is not None and self.turns.mutes_caller(now_ms):
                audio = bytes(len(audio))  # the caller's words over a greeting that may not be cut: not heard
            self._out.extend(ToEngine(c) for c in self.barge_in.caller_audio(audio, self.caller.input_ms, now_ms, self.speech, said_until_ms=self.caller.said_until_ms(now_ms)))

    def _answer_took(self, audio: bytes, now_ms: int) -> bool:
        """A placed call's callee while who answered is not known (``AgentTurns.answer``): True where that took it."""
        taken = self.turns.answer(audio, now_ms)
        if isinstance(taken, EndReason):
            self._end_by_agent(EndCause(taken), hang_up=True)
        elif taken is not None:
            self._to_engine(taken)
        return taken is not None

    def _protocol_error(self, reason: ProtocolErrorReason, detail: str) -> RemoteProtocolError:
        return RemoteProtocolError(reason, detail, provider=self.codec.provider, stream_id=self.codec.stream_id)

    # ------------------------------------------------------------------- state

    def _fail(self, exc: RemoteProtocolError) -> None:
        self.phase.fail(exc, started=self.start_request is not None)


_ENGINE_FAILURES: Final = frozenset(
    {ErrorCode.CONNECTION_FAILED, ErrorCode.PROTOCOL_ERROR, ErrorCode.INTERNAL_ERROR, "client_error", "transport_error"}
    # the server going away (vllm-omni's close_all_sessions at shutdown, a torn-down request, a lost socket it
    # could not keep): the call did not end on purpose
    | {"shutdown", "request_cleanup", "disconnect", "open_abandoned", "session_created_undelivered"}
    | FATAL_RESUME_CODES
)


def _session_end(event: SessionClosed | SessionExpired) -> EndCause:
    """How the engine's end of the session ends the stream."""
    kind = EndReason.ENGINE_SESSION_EXPIRED if isinstance(event, SessionExpired) else EndReason.ENGINE_SESSION_CLOSED
    return EndCause(kind, event.reason)


def _is_engine_failure(reason: str) -> bool:
    """A session end that is a failure (not the agent or the bridge ending the call on purpose)."""
    return reason in _ENGINE_FAILURES or reason.startswith("resync_required")


def engine_failure_kind(cause: EndCause) -> str:
    """``failures_by_engine`` as a metric label from a bounded set: the engine's code (``connection_failed``,
    ``session_resume_expired``, ``shutdown``…), ``expired`` (the engine's grace or idle TTL), ``resync_required``,
    ``engine_stream_failed`` (the bridge could not read the session), else ``other``."""
    if cause.kind is EndReason.ENGINE_SESSION_EXPIRED:
        return "expired"
    if cause.kind is EndReason.ENGINE_STREAM_FAILED:
        return EndReason.ENGINE_STREAM_FAILED.value
    if cause.detail.startswith("resync_required"):
        return "resync_required"
    return cause.detail if cause.detail in _ENGINE_FAILURES else "other"
