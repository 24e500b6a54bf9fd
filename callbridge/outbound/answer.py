"""Who answered a call the agent placed (#42), sans-I/O: a person, or a machine — and, for a machine, when its
greeting is over (its beep, or its silence) so the voicemail message can go. A speech-to-speech model talks the
moment it hears anything, so its audio is held until this says "person"; a machine never hears it before its beep.

Timing alone, frame by frame (a frame at least ``speech_db`` loud is sound; the greeting runs from its first sound to
its last):

- **person**: a greeting, then silence — "Hello?" and the person waits for the caller. How long the silence must be
  depends on how long the greeting was: a machine pauses between its sentences (380 ms at most in the synthetic
  corpus, more in the field), so only a greeting as short as a person's hello (``short_greeting_ms``) is decided
  after ``short_silence_ms``; a longer one after ``silence_ms``. No decision while a tone sounds (a beep, perhaps);
- **machine**: speech (pauses shorter than ``silence_ms`` bridged) going on past ``long_greeting_ms`` — no one says
  that much before hearing who called — or a beep (``beep.BeepDetector``) at any point;
- **uncertain**: nobody speaks for ``initial_silence_ms`` (a person who answers and waits, or a dead line), or no
  decision by ``max_analysis_ms``: the call's configured default decides.

After "machine" it goes on listening: ``MessageCue`` says when the message may start — the end of the beep, or, where
none comes, ``machine_silence_ms`` of silence after the greeting.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from callbridge.outbound.beep import BeepDetector

__all__ = ["AnswerClassifier", "AnswerSettings", "Decided", "MessageCue"]


@dataclass(frozen=True, slots=True)
class AnswerSettings:
    speech_db: float = 45.0
    short_greeting_ms: int = 800
    """A greeting this short ("Hello?", "Yes?") is a person's once ``short_silence_ms`` of silence follows."""
    short_silence_ms: int = 300
    silence_ms: int = 700
    """Silence after a longer greeting that makes it a person's: longer than a machine's pauses between its
    sentences (380 ms at most in the corpus) and, for a machine whose greeting is short, than the wait before its
    beep (a 2.2 s greeting, its beep 1 s after, is taken for a person's; 0.6 s after, not). Measured in
    ``bench/answering_machine.py``."""
    long_greeting_ms: int = 2500
    """Speech going on this long is a machine's."""
    initial_silence_ms: int = 3000
    max_analysis_ms: int = 6000
    machine_silence_ms: int = 1500
    """After a machine's greeting with no beep: silence this long, and the message goes."""


@dataclass(frozen=True, slots=True)
class Decided:
    """Who answered, decided at ``at_ms`` (from the answer): ``why``; ``greeting_ms`` how long they spoke, and
    ``greeting_end_ms`` where it ended (a person's: the agent should be heard soon after)."""

    answered_by: Literal["person", "machine", "uncertain"]
    why: Literal["short_greeting", "greeting", "long_greeting", "beep", "silence", "too_long"]
    at_ms: int
    greeting_ms: int
    greeting_end_ms: int | None


@dataclass(frozen=True, slots=True)
class MessageCue:
    """A machine's greeting is over at ``at_ms``: the voicemail message may start (``after`` its beep, or silence)."""

    at_ms: int
    after: Literal["beep", "silence"]


class AnswerClassifier:
    """One answered call's classifier (see the module docstring): ``frame`` each 20 ms of the callee's audio from the
    answer on (PCM16 at ``rate_hz``), until it has said who answered and, for a machine, when to speak."""

    def __init__(self, rate_hz: int = 8000, settings: AnswerSettings | None = None) -> None:
        self.settings = settings or AnswerSettings()
        self._beeps = BeepDetector(rate_hz)
        self._speech_from_ms: int | None = None
        """The greeting's first sound."""
        self._sound_until_ms: int | None = None
        """The end of the greeting's last sound so far."""
        self.decided: Decided | None = None
        self.cue: MessageCue | None = None
        self._cue_untold = False

    def frame(self, pcm: bytes, at_ms: int) -> Decided | MessageCue | None:
        """The next frame, from ``at_ms`` of the answered call: a decision, a machine's cue, or None."""
        if self.cue is not None:  # a beep decided it a machine's and cued the message at once: said a frame later
            cue, self._cue_untold = (self.cue if self._cue_untold else None), False
            return cue
        beep = self._beeps.frame(pcm, at_ms)
        loud = self._beeps.level_db >= self.settings.speech_db and not self._beeps.tone_ms  # a tone is no one's greeting
        end_ms = at_ms + self._beeps.settings.frame_ms
        if loud:
            if self._speech_from_ms is None:
                self._speech_from_ms = at_ms
            self._sound_until_ms = end_ms
        if self.decided is None:
            if self._beeps.tone_ms and beep is None:
                return None  # a tone sounding: a beep, perhaps (silence around it is not yet a person's)
            decided = self._decide(end_ms, beep is not None)
            if decided is not None:
                self.decided = decided
                if decided.why == "beep" and beep is not None:
                    self.cue, self._cue_untold = MessageCue(beep.end_ms, "beep"), True
                return decided
            return None
        if self.decided.answered_by != "machine":
            return None
        if beep is not None:
            self.cue = MessageCue(beep.end_ms, "beep")
        elif self._sound_until_ms is not None and end_ms - self._sound_until_ms >= self.settings.machine_silence_ms:
            self.cue = MessageCue(end_ms, "silence")
        return self.cue

    def _decide(self, now_ms: int, beeped: bool) -> Decided | None:
        s = self.settings
        start, until = self._speech_from_ms, self._sound_until_ms
        greeting = 0 if start is None or until is None else until - start
        if beeped:
            return Decided("machine", "beep", now_ms, greeting, until)
        if start is None or until is None:
            return Decided("uncertain", "silence", now_ms, 0, None) if now_ms >= s.initial_silence_ms else None
        silent = now_ms - until
        if greeting <= s.short_greeting_ms and silent >= s.short_silence_ms:
            return Decided("person", "short_greeting", now_ms, greeting, until)
        if silent >= s.silence_ms and greeting < s.long_greeting_ms:
            return Decided("person", "greeting", now_ms, greeting, until)
        if greeting >= s.long_greeting_ms:
            return Decided("machine", "long_greeting", now_ms, greeting, until)
        if now_ms >= s.max_analysis_ms:
            return Decided("uncertain", "too_long", now_ms, greeting, until)
        return None
