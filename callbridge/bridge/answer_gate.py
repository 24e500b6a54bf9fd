"""Who answered a call the agent placed, on its first stream (#42), sans-I/O. A speech-to-speech model talks the
moment it hears anything, so from the bind its audio is held — queued in the ledger, nothing sent to the carrier
(``PlayoutLedger.gated``) — while the callee's audio, as it goes to the engine, is classified 20 ms at a time
(``callbridge.outbound.answer.AnswerClassifier``):

- **a person** (or nobody heard, where ``on_uncertain`` says person): what was held plays at once, from its start —
  the greeting, or the model's answer to their "Hello?";
- **a machine**: what was held is dropped and the reply being generated cancelled (the machine never hears the
  agent before its greeting is over); ``hang_up``: the call ends; ``voicemail``: once the machine's beep has ended
  (or the silence after its greeting), the model is told to say the voicemail message, which plays, and then the
  call is hung up (``AfterReply``, as a goodbye is).

While a reply is held, the callee's words go to the engine marked *listen* (``holds_reply``): the greeting
generated at the answer is not cut by a "Hello?" that never heard it.

What it decided goes out as ``Observed("answered-by")`` (the application's ``call.machine_detected``), the cue as
``Observed("voicemail-cue")``.
"""

from __future__ import annotations

from typing import Final, Protocol

from callbridge.application import MachineDetection
from callbridge.bridge.agent_speech import AgentSpeech
from callbridge.bridge.call_outputs import CallOutput, Observed, ToEngine
from callbridge.bridge.end_reason import EndReason
from callbridge.engine.commands import CancelResponse
from callbridge.outbound.answer import AnswerClassifier, Decided, MessageCue

__all__ = ["AnswerGate", "LastWords"]

_FRAME_MS: Final = 20


class LastWords(Protocol):
    """Who asks the model for a reply that ends the call once it has played (``AgentTurns``)."""

    def last_words(self, text: str, reason: EndReason, now_ms: int) -> None: ...


class AnswerGate:
    """One placed call's answer, judged on its first stream. See the module docstring."""

    __slots__ = ("detection", "rate_hz", "classifier", "decided", "cued", "_speech", "_turns", "_out", "_pending", "_frame_bytes", "_at_ms")

    def __init__(self, detection: MachineDetection, rate_hz: int, speech: AgentSpeech, turns: LastWords, out: list[CallOutput]) -> None:
        self.detection = detection
        self.rate_hz = rate_hz
        self.classifier = AnswerClassifier(rate_hz)
        self.decided: Decided | None = None
        self.cued: MessageCue | None = None
        self._speech = speech
        self._turns = turns
        self._out = out
        self._pending = bytearray()
        self._frame_bytes = rate_hz * _FRAME_MS // 1000 * 2
        self._at_ms = 0
        """Where the callee's audio classified so far ends, from the bind (the answer's media)."""
        speech.ledger.gated = True

    @property
    def listening(self) -> bool:
        """Still listening: who answered is not known, or a machine's greeting is not over."""
        if self.decided is None:
            return True
        return self._answered_by == "machine" and self.detection.mode == "voicemail" and self.cued is None

    def holds_reply(self, now_ms: int) -> bool:
        """A reply is held (the greeting, generated at the answer): the callee's words while who answered is not
        known go to the engine marked *listen* — they cannot be interrupting what they have not heard, and the
        reply is theirs to hear once they are known for a person. With nothing held, their words are a turn."""
        return self.listening and self._speech.ledger.gated and self._speech.responding(now_ms)

    @property
    def _answered_by(self) -> str:
        assert self.decided is not None
        answered_by = self.decided.answered_by
        return self.detection.on_uncertain if answered_by == "uncertain" else answered_by

    def heard(self, pcm: bytes, now_ms: int) -> EndReason | None:
        """The callee's audio (PCM16 at the engine's rate), as it goes to the engine. Returned: the call's end, where
        a machine is to be hung up on now."""
        if not self.listening:
            return None
        pending, size = self._pending, self._frame_bytes
        pending += pcm
        while len(pending) >= size:
            frame = bytes(pending[:size])
            del pending[:size]
            said = self.classifier.frame(frame, self._at_ms)
            self._at_ms += _FRAME_MS
            if isinstance(said, Decided):
                if self._decided(said, now_ms):
                    return EndReason.MACHINE_DETECTED
            elif isinstance(said, MessageCue):
                self._leave_message(said, now_ms)
            if not self.listening:
                pending.clear()
                break
        return None

    def _decided(self, decided: Decided, now_ms: int) -> bool:
        """Who answered is known: True where the call is to end now (a machine, ``hang_up``)."""
        self.decided = decided
        self._out.append(Observed("answered-by", decided.at_ms, decided.greeting_ms, detail=f"{decided.answered_by}:{decided.why}"))
        if self._answered_by == "person":
            self._speech.ledger.ungate(now_ms)
            self._speech.drain()
            return False
        self._drop_held(now_ms)
        if self.detection.mode == "hang_up":
            return True
        if decided.answered_by == "uncertain":  # nobody heard, taken for a machine: no greeting to wait out
            self._leave_message(MessageCue(decided.at_ms, "silence"), now_ms)
        return False

    def _leave_message(self, cue: MessageCue, now_ms: int) -> None:
        """The machine's greeting is over: the replies to it dropped, the voicemail message asked for and played,
        then the hang-up."""
        self.cued = cue
        self._out.append(Observed("voicemail-cue", cue.at_ms, detail=cue.after))
        self._drop_held(now_ms)
        self._speech.ledger.ungate(now_ms)
        assert self.detection.voicemail_message is not None
        self._turns.last_words(self.detection.voicemail_message, EndReason.VOICEMAIL_LEFT, now_ms)

    def _drop_held(self, now_ms: int) -> None:
        """What the model said to the machine goes unheard: the queue dropped, the reply still arriving cancelled
        (its late audio dropped)."""
        speech = self._speech
        replying = speech.audio.response_id
        held = speech.ledger.queued_responses()
        if replying is not None or held:
            self._out.append(ToEngine(CancelResponse()))
        for response_id in dict.fromkeys([*held, *([replying] if replying is not None else [])]):
            speech.audio.interrupted.add(response_id)
        if replying is not None:
            speech.audio.stop()
        speech.ledger.flush(now_ms)
        speech.ledger.actions_to_send()  # nothing was sent: the carrier has nothing to clear
