"""The stream's phase and how it ended, sans-I/O: ``CallState``, changed only through ``TRANSITIONS``
(``bridge/call_state.py``), beside the account of the stream's end that the inputs ending it leave — its reason, the
carrier's protocol error, the engine's failure or the limit that ended it, whether its engine session is left for
the call's next stream and what of the reply playing at a drop goes with it. ``facts`` (for the stream's
``CallLifecycle``) and ``report`` (for the log, the metrics and the application) are read from it and the call's
parts. And what ending does: the engine session closed, the call hung up the carrier's way, the carrier's socket
closed with the code its end calls for. ``CallSession`` (``bridge/call.py``) holds one per stream.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from callbridge.bridge.agent_speech import AgentSpeech
from callbridge.bridge.call_outputs import CallOutput, StreamReport, ToEngine
from callbridge.bridge.call_state import CARRIER_TRIGGERS, TRANSITIONS, CallState, CallStateError, Trigger
from callbridge.bridge.caller_audio import CallerAudio
from callbridge.bridge.carrier_link import CarrierLink
from callbridge.bridge.end_reason import EndCause, EndReason
from callbridge.bridge.lifecycle import StreamFacts
from callbridge.carriers.base import ProtocolErrorReason, RemoteProtocolError
from callbridge.engine.commands import CloseSession
from callbridge.engine.port import UnheardAudio

__all__ = ["OVER", "StreamPhase"]

OVER: Final = (CallState.ENDED, CallState.DETACHED)
"""The stream is over: ended with the call, or its session left for the next stream. A tuple: membership by
identity, on every message (a set would hash the enum)."""


class StreamPhase:
    """One stream's phase and the account of its end (see the module docstring)."""

    def __init__(
        self,
        link: CarrierLink,
        speech: AgentSpeech,
        out: list[CallOutput],
        protocol_error: Callable[[ProtocolErrorReason, str], RemoteProtocolError],
    ) -> None:
        """``speech``: the agent's (what it holds back of what the caller heard goes, or is dropped, as the stream
        leaves LIVE); ``out``: the call's outputs; ``protocol_error``: the carrier's error for a carrier event out
        of order (it ends the call)."""
        self._link, self._speech, self._out, self._protocol_error = link, speech, out, protocol_error
        self.state = CallState.AWAITING_START
        self.reason: EndCause | None = None
        """Why the stream ended (``EndReason``, or the engine's, the application's, a protocol error's)."""
        self.failure: RemoteProtocolError | None = None
        """The carrier's protocol error that ended the stream, if one did (the driver logs it)."""
        self.engine_failure: EndCause | None = None
        """Why the engine failed this call, if it did (the driver counts it)."""
        self.limit_reached: str | None = None
        """The limit that ended the stream (``first_message_timeout``, ``idle_timeout``, ``max_call_duration``…)."""
        self.detach = False
        """The stream dropped while bound: its engine session is left for the call's next stream."""
        self.unheard: UnheardAudio | None = None
        """The rest of the reply playing when the stream dropped, for the next stream."""

    @property
    def over(self) -> bool:
        return self.state in OVER

    def go(self, trigger: Trigger) -> None:
        """The next phase for ``trigger``; a pair not in the table is the carrier's protocol error (a carrier
        event out of order) or ``CallStateError`` (the driver's: a bug). A stream that takes the call over holds what
        it would tell the engine of what the caller heard until the engine's replay is in: leaving LIVE first, it
        tells it now (or never), unless the session is another stream's now (``REPLACED``: nothing is its to tell)."""
        if trigger is Trigger.CARRIER_EVENT and self.state is CallState.LIVE:
            return  # every media frame of a live call: (LIVE, CARRIER_EVENT) → LIVE without hashing enums
        self._go(trigger)
        if self._speech.heard.held_until_ms is not None and self.state is not CallState.LIVE:
            if trigger is Trigger.REPLACED:
                self._speech.heard.drop_held()
            else:
                self._speech.release_held_tells()

    def end(self, trigger: Trigger, reason: EndCause, *, close_session: bool = False, hang_up: bool = False) -> None:
        """The stream ends for ``reason`` (``finish``)."""
        self.go(trigger)
        self.finish(reason, close_session=close_session, hang_up=hang_up)

    def replaced(self) -> None:
        """A newer stream took the session over (this one was taken for dead): this one ends quietly, the call not
        over, nothing to detach, nothing more sent."""
        self.go(Trigger.REPLACED)
        self.reason = EndCause(EndReason.SESSION_REPLACED)
        self._link.drop_messages()
        self._link.going_away = True
        self.close_transport()

    def _go(self, trigger: Trigger) -> None:
        """The table's step alone: ``end_call`` and ``fail`` take it, closing the session themselves at once, so what
        a takeover holds back of what was heard has nobody left to tell."""
        try:
            self.state = TRANSITIONS[(self.state, trigger)]
        except KeyError:
            if trigger in CARRIER_TRIGGERS:
                raise self._protocol_error(ProtocolErrorReason.OUT_OF_ORDER, f"{trigger.value} while {self.state.value}") from None
            raise CallStateError(f"{trigger.value} while {self.state.value}") from None

    def finish(self, reason: EndCause, *, close_session: bool = False, hang_up: bool = False) -> None:
        """The stream has ended for ``reason`` (its phase changed): the engine session closed (``close_session``),
        the call hung up the carrier's way (``hang_up``), the socket closed."""
        self.reason = reason
        if close_session:
            self._out.append(ToEngine(CloseSession(reason)))
        if hang_up:
            self.hang_up(reason)
        self.close_transport()

    def end_call(self, reason: EndCause) -> None:
        """The bridge ends the call (a limit was reached): the engine session closed, the call hung up the
        carrier's way (if it was bridged), the socket closed."""
        bridged = self.state in (CallState.LIVE, CallState.ENDING)
        if self.state is CallState.LIVE:
            self._out.append(ToEngine(CloseSession(reason)))
        self._go(Trigger.FAILED)
        self.reason = reason
        if bridged:
            self.hang_up(reason)
        self.close_transport()

    def fail(self, exc: RemoteProtocolError, *, started: bool) -> None:
        """A carrier message broke the protocol: the engine session is closed; a known call (``started``: bound or
        being bound) is hung up the carrier's way; the socket closed (a policy violation)."""
        bound = self.state is CallState.LIVE
        self.failure = exc
        self._go(Trigger.FAILED)
        self.reason = EndCause(EndReason.PROTOCOL_ERROR, exc.reason.value)
        if bound:
            self._out.append(ToEngine(CloseSession("carrier_protocol_error")))
        if started:
            self.hang_up(self.reason)
        self.close_transport()

    def play_out_fallback(self, now_ms: int) -> None:
        """ENDING: the fallback tone paced out; once it has played, the hang-up."""
        speech = self._speech
        speech.ledger.tick(now_ms)
        speech.drain(to_engine=False)
        if not speech.ledger.is_playing(now_ms):
            self.go(Trigger.FALLBACK_PLAYED)
            self.hang_up(self.reason or "engine_failed")

    def hang_up(self, reason: str) -> None:
        """End the phone call the carrier's way (REST by the driver, in band, or by closing), then the socket."""
        self._link.hang_up(reason)
        self.close_transport()

    def close_transport(self) -> None:
        self._link.close(self.close_code)

    @property
    def close_code(self) -> int:
        """The close code of the carrier's connection: a policy violation for a protocol error or someone else's
        token; going away for a stream moved or superseded (``CarrierLink.going_away``); else normal."""
        return self._link.close_code(policy_violation=self.failure is not None or (self.reason is not None and self.reason.kind is EndReason.BAD_TOKEN))

    def facts(self, caller: CallerAudio, speech: AgentSpeech) -> StreamFacts:
        """What the stream's ``CallLifecycle`` needs of it, now."""
        return StreamFacts(
            awaiting_engine=self.state is CallState.STARTING,
            call_over=self.state is CallState.ENDED,
            end_reason=self.reason,
            detach=self.detach,
            input_ms=caller.input_ms,
            heard_ms=speech.heard.cut_replies,  # for the next stream, through the resume ticket
            unheard=self.unheard,
            told_ms=speech.heard.told_so_far,
        )

    def report(self, caller: CallerAudio, speech: AgentSpeech) -> StreamReport:
        """The stream's account of itself, as it ends."""
        ledger = speech.ledger
        return StreamReport(
            facts=self.facts(caller, speech),
            limit_reached=self.limit_reached,
            engine_failure=self.engine_failure,
            failure=self.failure,
            stream_input_ms=caller.inbound.stream_media_ms,
            output_ms=ledger.frames_sent * ledger.frame_ms,
            frames_sent=ledger.frames_sent,
            frames_flushed=ledger.frames_dropped,
            barge_ins=speech.flushes,
            late_deltas_dropped=speech.late_deltas_dropped,
            barge_in_pauses=speech.pauses,
            barge_in_resumes=speech.resumes,
            barge_in_echo_ms=speech.echo_ms,
            heard_corrections=ledger.corrections,
            playout_underruns=ledger.underruns,
            media_until_ms=caller.media_until_ms,
            first_agent_audio_ms=speech.first_audio_after_ms,
        )
