"""Who answered a call the agent placed (``callbridge/outbound/answer.py``, #42), over the answering corpus
(``bench/corpus/answers``) through the line: a person is a person soon after their greeting, a machine is never taken
for one when its beep comes within ``silence_ms`` of its greeting, and its message is cued at the beep's end; the
full sweep is ``bench/answering_machine.py``."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from callbridge.outbound.answer import AnswerClassifier, AnswerSettings, Decided, MessageCue
from tests.outbound.test_beep import line, silence, tone

pytestmark = pytest.mark.core

ANSWERS = Path(__file__).resolve().parents[2] / "bench" / "corpus" / "answers"
SETTINGS = AnswerSettings()


def load(name: str) -> np.ndarray:
    with wave.open(str(ANSWERS / f"{name}.wav")) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)


def answered(frames: list[bytes]) -> list[Decided | MessageCue]:
    classifier = AnswerClassifier()
    return [out for k, pcm in enumerate(frames) if (out := classifier.frame(pcm, k * 20)) is not None]


def names(kind: str) -> list[str]:
    return sorted(path.stem for path in ANSWERS.glob(f"{kind}-*.wav"))


@pytest.mark.parametrize("name", names("person"))
def test_a_person_is_a_person_soon_after_their_greeting(name: str) -> None:
    greeting = load(name)
    end_ms = 300 + len(greeting) * 1000 // 8000
    (decided,) = answered(line(silence(300), greeting, silence(3000)))
    assert isinstance(decided, Decided) and decided.answered_by == "person", decided
    wait = SETTINGS.short_silence_ms if decided.why == "short_greeting" else SETTINGS.silence_ms
    assert 0 <= decided.at_ms - end_ms <= wait + 40, (decided, end_ms)
    if end_ms - 300 <= SETTINGS.short_greeting_ms - 60:  # a hello as short as that: the agent is heard 300 ms after it
        assert decided.why == "short_greeting", decided


@pytest.mark.parametrize("name", names("machine") + names("ivr"))
def test_a_machine_is_never_taken_for_a_person_and_its_message_goes_after_the_beep(name: str) -> None:
    greeting = load(name)
    beep_end_ms = 300 + len(greeting) * 1000 // 8000 + 600 + 400
    decided, cue = answered(line(silence(300), greeting, silence(600), tone(1000.0, 400, level=3000.0), silence(1000)))
    assert isinstance(decided, Decided) and decided.answered_by == "machine", decided
    assert isinstance(cue, MessageCue) and cue.after == "beep" and 0 <= cue.at_ms - beep_end_ms <= 40, (cue, beep_end_ms)


def test_a_machine_with_no_beep_is_cued_after_its_greetings_silence() -> None:
    greeting = load("machine-0-m3")
    end_ms = 300 + len(greeting) * 1000 // 8000
    decided, cue = answered(line(silence(300), greeting, silence(3000)))
    assert isinstance(decided, Decided) and (decided.answered_by, decided.why) == ("machine", "long_greeting")
    assert decided.at_ms <= 300 + SETTINGS.long_greeting_ms + 200  # decided while it still speaks
    assert isinstance(cue, MessageCue) and cue.after == "silence"
    assert 0 <= cue.at_ms - end_ms - SETTINGS.machine_silence_ms <= 60, (cue, end_ms)


def test_nobody_speaking_is_uncertain() -> None:
    (decided,) = answered(line(silence(5000), noise_db=35.0))
    assert isinstance(decided, Decided) and (decided.answered_by, decided.why, decided.at_ms) == ("uncertain", "silence", SETTINGS.initial_silence_ms)


def test_a_short_greeting_whose_beep_comes_late_is_taken_for_a_person() -> None:
    """The limit of timing alone: a 2.2 s greeting ("Hey, it's Mike. Leave a message.") and its beep a second later
    sound like a person's longer hello and a wait — decided before the beep. Within ``silence_ms`` it is a machine."""
    greeting = load("machine-4-m3")
    late = answered(line(silence(300), greeting, silence(1000), tone(1000.0, 400, level=3000.0), silence(1000)))
    soon = answered(line(silence(300), greeting, silence(SETTINGS.silence_ms - 100), tone(1000.0, 400, level=3000.0), silence(1000)))
    assert [(d.answered_by, d.why) for d in late if isinstance(d, Decided)] == [("person", "greeting")]
    assert [(d.answered_by, d.why) for d in soon if isinstance(d, Decided)] == [("machine", "beep")]
