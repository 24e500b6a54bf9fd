"""The agent's turns on one stream, sans-I/O: what the call's agent does around the caller's turns, beyond its audio.

The greeting (and, where it may not be cut, the caller muted while it plays: ``GreetingGuard``), the caller's
silence (a prompt, then a goodbye and the hang-up: ``SilenceWatch``), the agent's function calls (``AgentActions``:
``end_call``, transfers, DTMF, the application's tools, their fillers), what waits for the agent's reply to play out
(``AfterReply``: a tool's result the model answers once the agent is silent, the hang-up asked for), and the turn's
latency (the caller stopped → the reply's first audio out).

``CallSession`` composes it and decides when (only a live stream's agent takes turns); this part asks the agent's
speech (``AgentSpeech``) whether a reply is arriving or playing, and puts what it tells the engine into the call's
one queue. What ends the call it answers (``hang_up_due``, ``action_finished``) and the call ends it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from callbridge.bridge.actions import ActionResult, ApplicationToolCall, TransferCall
from callbridge.bridge.agent_actions import AgentActions
from callbridge.bridge.agent_speech import AgentSpeech
from callbridge.bridge.answer_gate import AnswerGate
from callbridge.bridge.binding import AgentSetup
from callbridge.bridge.call_outputs import CallOutput, Observed, ToEngine
from callbridge.bridge.end_reason import EndReason
from callbridge.bridge.turns import AfterReply, GreetingGuard, SilenceWatch
from callbridge.engine.commands import AppendAudio, CloseSession, CreateResponse, CreateTextItem, FunctionCallOutput
from callbridge.engine.events import EngineEvent, FunctionCall, SpeechStarted, SpeechStopped

__all__ = ["AgentTurns", "Transferred"]

_TURN_BEHIND_MAX_MS: Final = 5000
"""A ``SpeechStopped`` whose end lies further back than this in the input (or ahead of it) is timed from its arrival."""


@dataclass(frozen=True, slots=True)
class Transferred:
    """The agent's transfer of the call succeeded: the call ends (``hang_up``: the bridge hangs up its leg — SIP's
    BYE after the REFER — unless the call left the bridge with it)."""

    hang_up: bool


class AgentTurns:
    """The agent's turns around the caller's on one stream. See the module docstring."""

    __slots__ = ("actions", "silence", "greeting", "after_reply", "answer_gate", "turn_silence_ms", "_caller_stopped_ms", "_speech", "_out")

    def __init__(
        self, actions: AgentActions, turn_silence_ms: int, speech: AgentSpeech, out: list[CallOutput]
    ) -> None:
        self.actions = actions
        """The agent's function calls under way (``bridge/agent_actions.py``)."""
        self.silence = SilenceWatch()
        """A caller who says nothing (``bridge/turns.py``)."""
        self.greeting = GreetingGuard()
        """A greeting that may not be cut."""
        self.after_reply = AfterReply()
        """What waits for the agent's reply to play out: a tool's answer, the hang-up."""
        self.answer_gate: AnswerGate | None = None
        """A placed call's first stream: the agent's audio held until who answered is known (``bridge/answer_gate.py``)."""
        self.turn_silence_ms = turn_silence_ms
        """The session's ``server_vad`` silence (the call's assistant may set its own: ``bound``)."""
        self._caller_stopped_ms: int | None = None
        """When the caller last stopped speaking (the engine's ``SpeechStopped``), until the reply's audio comes."""
        self._speech = speech
        self._out = out

    def bound(self, agent: AgentSetup, now_ms: int, *, rate_hz: int = 16000) -> None:
        """The engine session is bound: what the call's agent does on this stream (``rate_hz``: the callee's audio
        as the engine takes it, for a placed call's ``AnswerGate``)."""
        if agent.machine_detection is not None:
            self.answer_gate = AnswerGate(agent.machine_detection, rate_hz, self._speech, self, self._out)
        self.actions.bound(agent.application_tools, agent.tool_filler)
        self.silence.bound(agent.silence, now_ms)
        if agent.turn_silence_ms is not None:
            self.turn_silence_ms = agent.turn_silence_ms

    def greet(self, agent: AgentSetup, now_ms: int) -> None:
        """The agent's greeting, if it has one: the model says it now (the caller muted while it plays, where it may
        not be cut)."""
        if agent.greeting:
            self._ask(agent.greeting)
            if not agent.greeting_interruptible:
                self.greeting.guard(now_ms)

    def answer(self, audio: bytes, now_ms: int) -> EndReason | AppendAudio | None:
        """A placed call's callee, heard while who answered is not known (``AnswerGate``): the call's end (a machine
        hung up on), or how the audio goes to the engine (*listen*, while a reply is held), or None: as any caller's."""
        gate = self.answer_gate
        if gate is None or not gate.listening:
            self.answer_gate = None  # decided: nothing more to judge
            return None
        end = gate.heard(audio, now_ms)
        if end is not None:
            return end
        return AppendAudio(audio, gate.rate_hz, "listen") if gate.holds_reply(now_ms) else None

    def last_words(self, text: str, reason: EndReason, now_ms: int) -> None:
        """The model is told ``text`` and asked to answer; once that reply has played, the call is hung up for
        ``reason`` (a machine's voicemail message: ``answer_gate``)."""
        self._ask(text)
        self.after_reply.goodbye_asked(now_ms, reason)

    def _ask(self, text: str) -> None:
        """The model is told ``text`` and asked to answer."""
        self._out.append(ToEngine(CreateTextItem(text)))
        self._out.append(ToEngine(CreateResponse()))

    def on_event(self, event: EngineEvent, input_ms: int, now_ms: int) -> bool:
        """An engine event of the turns: the caller started or stopped speaking (``input_ms`` of the input handed over
        so far), or the agent calls a function. False: not one of those."""
        match event:
            case SpeechStopped(audio_end_ms, _):  # when the caller stopped, on this stream's clock
                self.caller_stopped(audio_end_ms, input_ms, now_ms)
            case SpeechStarted():
                self.caller_started(now_ms)
            case FunctionCall():
                self.function_call(event)
            case _:
                return False
        return True

    # ------------------------------------------------------------ the caller

    def caller_started(self, now_ms: int) -> None:
        self.silence.caller_spoke(speaking=True, now_ms=now_ms)

    def caller_stopped(self, audio_end_ms: int, input_ms: int, now_ms: int) -> None:
        """The engine heard the caller stop at ``audio_end_ms`` of the input (``input_ms`` of it handed over so far):
        when that was on this stream's clock, less the session's silence, is when the turn's latency counts from."""
        behind_ms = input_ms - audio_end_ms
        detected_ms = now_ms - behind_ms if 0 <= behind_ms <= _TURN_BEHIND_MAX_MS else now_ms
        self._caller_stopped_ms = detected_ms - self.turn_silence_ms
        self.silence.caller_spoke(speaking=False, now_ms=now_ms)

    def mutes_caller(self, now_ms: int) -> bool:
        """The caller's words are over a greeting that may not be cut: the engine hears silence instead."""
        greeting, speech = self.greeting, self._speech
        return greeting.muted_until_ms is not None and greeting.mutes(now_ms, speech.audio.response_id, speech.ledger)

    def check_silence(self, now_ms: int) -> None:
        """The caller has said nothing for long enough: the model is told to prompt them, or to say goodbye (and the
        call is hung up once that has played). Never while the agent is speaking or a reply is coming."""
        silence = self.silence
        if not silence.watching or self.after_reply.hang_up_reason is not None:
            return
        busy = self._speech.responding(now_ms) or bool(self.actions.running)
        prompt = silence.check(now_ms, self._speech.ledger.playing_until_ms, busy=busy)
        if prompt is None:
            return
        self._ask(prompt.text)
        if prompt.hang_up:
            self.after_reply.goodbye_asked(now_ms)
        self._out.append(Observed("silence", prompt.quiet_ms, detail="hang_up" if prompt.hang_up else "reprompt"))

    def silence_due_ms(self) -> int | None:
        """When the caller's silence next calls for something (``SilenceWatch``), or None."""
        if self.after_reply.hang_up_reason is not None:
            return None
        return self.silence.due_ms(self._speech.ledger.playing_until_ms)

    # ------------------------------------------------------------- the agent

    def reply_began(self, response_id: str, now_ms: int) -> None:
        """The audio of a new reply arrives: a goodbye asked for, the greeting, or the answer to the caller's turn
        (its latency observed now, as its first audio goes out)."""
        self.after_reply.reply_began(response_id)  # a goodbye asked for is this reply: it plays, then the hang-up
        self.greeting.reply_began(response_id)  # the first reply of a new session: the greeting
        if self._caller_stopped_ms is not None:
            self._out.append(Observed("turn", max(0, now_ms - self._caller_stopped_ms), response_id=response_id))
            self._caller_stopped_ms = None

    def reply_cancelled(self) -> None:
        """The caller took the turn: the response that does hears a tool's result, not one asked for after."""
        self.after_reply.respond = False

    def function_call(self, call: FunctionCall) -> None:
        if self.actions.function_call(call, self._out, ending=self.after_reply.hang_up_reason is not None):
            self.after_reply.end_call_asked()

    def hang_up_due(self, now_ms: int) -> EndReason | None:
        """Why to hang up now, if a hang-up was asked for (``end_call``, a silent caller's goodbye) and the reply being
        received has ended and its audio has played."""
        after = self.after_reply
        if after.hang_up_reason is None:
            return None
        return after.hang_up_due(now_ms, self._speech.audio.response_id, self._speech.ledger)

    def reply_played(self, now_ms: int, *, live: bool) -> EndReason | None:
        """What waited for the agent's reply to play out, on a ``live`` stream: the hang-up asked for (its reason,
        returned: the call ends), else a tool's result to answer (asked for here). Looked at on every event and
        tick: mostly nothing waits."""
        after = self.after_reply
        if after.hang_up_reason is not None:
            reason = self.hang_up_due(now_ms)
            if reason is not None and live:
                if reason is EndReason.VOICEMAIL_LEFT:
                    self._out.append(Observed("voicemail-left"))
                return reason
        if after.respond and live:
            self.respond_when_silent(now_ms)
        return None

    def respond_when_silent(self, now_ms: int) -> None:
        """A tool's result reached the model while the agent spoke: the model answers it once that has played out
        and the engine was told so (``AfterReply.respond_due``)."""
        after, speech = self.after_reply, self._speech
        if not after.respond:
            return
        told_all = speech.told_all(after.last_response)
        responding = speech.responding(now_ms)
        if after.respond_due(now_ms, responding=responding, told_all=told_all, playing_until_ms=speech.ledger.playing_until_ms):
            self._out.append(ToEngine(CreateResponse()))

    def playout_deadline_ms(self) -> int | None:
        """The next moment the agent's side needs a look: a hang-up or a tool's answer once the reply has played,
        else the ledger's next frame."""
        after, speech = self.after_reply, self._speech
        if (after.hang_up_reason is not None or after.respond) and speech.audio.response_id is None:
            return after.deadline_ms(speech.ledger)
        return speech.ledger.next_deadline_ms()

    # ----------------------------------------------------------- the actions

    def action_finished(self, call_id: str, result: ActionResult, now_ms: int, *, live: bool) -> Transferred | None:
        """The carrier work of action ``call_id`` is over: the model hears the result (on a ``live`` stream, or one
        whose stop waited for the transfer). A transfer that succeeded is answered: the call ends."""
        actions = self.actions
        action = actions.finished(call_id)
        if action is not None and actions.closing_after_transfer and isinstance(action, TransferCall):
            # The stream stopped while the transfer was under way: its result decides how the call ended.
            actions.closing_after_transfer = False
            self._out.append(ToEngine(FunctionCallOutput(call_id, result.output())))
            self._out.append(ToEngine(CloseSession("transferred" if result.ok else "call_ended")))
            return Transferred(hang_up=False) if result.ok else None
        if action is None or not live:
            return None  # the call ended meanwhile: nobody to tell
        self._out.append(ToEngine(FunctionCallOutput(call_id, result.output())))
        if isinstance(action, ApplicationToolCall):  # the model speaks to the result: now, or after what it is saying
            if self._speech.responding(now_ms):
                self.after_reply.respond = True
            else:
                self._out.append(ToEngine(CreateResponse()))
        if isinstance(action, TransferCall) and result.ok:
            return Transferred(hang_up=not result.call_left)
        return None

    def tool_slow(self, call_id: str, now_ms: int) -> None:
        """The application's tool ``call_id`` has not answered yet: where a filler is configured and the agent is
        silent, it is told to say it (once per tool call)."""
        filler = self.actions.filler_due(call_id)
        if filler is None or self._speech.responding(now_ms):
            return
        self.actions.filler_said(call_id)
        self._ask(filler)
