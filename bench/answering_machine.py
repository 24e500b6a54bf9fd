"""Who answered a call the agent placed (#42): ``callbridge/outbound/answer.py`` over the answering corpus
(``bench/corpus/answers``: persons' greetings in five voices, voicemail greetings in three, IVR menus in two), each
answer through the telephone band, line noise and μ-law, the shipped settings.

    python bench/answering_machine.py [--beep-after-ms 300,600,1000]

Every answer is heard 300 or 800 ms after the pick-up, in line noise at 30 or 40 dB; a person then waits 4 s; a
machine's greeting is followed, ``--beep-after-ms`` later, by a 400 ms beep at 1000 or 1400 Hz. Printed per beep
gap: persons taken for persons, and how long after their greeting ended (the agent can be heard from then); machines
taken for machines (a machine taken for a person would hear the agent before its beep); the message's cue after the
beep's end. Machine: the one it runs on.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import sys
import wave
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from barge_in_corpus import percentile  # noqa: E402

from callbridge.outbound.answer import AnswerClassifier, Decided, MessageCue  # noqa: E402
from tests.outbound.test_beep import line, silence, tone  # noqa: E402

ANSWERS = Path(__file__).resolve().parent / "corpus" / "answers"


def load(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float64)


def answered(frames: list[bytes]) -> tuple[Decided | None, MessageCue | None]:
    """The classifier's decision and, for a machine, its cue (None: none came)."""
    classifier, decided = AnswerClassifier(), None
    for k, pcm in enumerate(frames):
        out = classifier.frame(pcm, k * 20)
        if isinstance(out, Decided):
            decided = out
        elif isinstance(out, MessageCue):
            return decided, out
    return decided, None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--beep-after-ms", default="300,600,1000")
    args = parser.parse_args()
    greetings = {path.stem: load(path) for path in sorted(ANSWERS.glob("*.wav"))}
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; {len(greetings)} answers")
    for gap in (int(ms) for ms in args.beep_after_ms.split(",")):
        persons, person_ms, machines, cues, wrong = 0, [], 0, [], set()
        total_persons = total_machines = 0
        for (name, greeting), lead, beep_hz, noise in itertools.product(greetings.items(), (300, 800), (1000.0, 1400.0), (30.0, 40.0)):
            person = name.startswith("person")
            end_ms = lead + len(greeting) * 1000 // 8000
            after = (silence(4000),) if person else (silence(gap), tone(beep_hz, 400, level=3000.0), silence(3000))
            decided, cue = answered(line(silence(lead), greeting, *after, noise_db=noise))
            said = decided.answered_by if decided is not None else None
            if person:
                total_persons += 1
                persons += said == "person"
                person_ms += [decided.at_ms - end_ms] if decided is not None and said == "person" else []
            else:
                total_machines += 1
                machines += said == "machine"
                cues += [cue.at_ms - (end_ms + gap + 400)] if cue is not None and said == "machine" else []
            if (said == "person") != person:
                wrong.add(name)
        print(f"\nbeep {gap} ms after a machine's greeting:")
        print(f"  persons taken for persons {persons}/{total_persons}; heard the agent after their greeting p50 "
              f"{percentile(person_ms, 0.5)} ms, p95 {percentile(person_ms, 0.95)} ms, max {max(person_ms, default='-')}")  # fmt: skip
        print(f"  machines taken for machines {machines}/{total_machines}; the message cued after the beep's end p50 "
              f"{percentile(cues, 0.5)} ms, p95 {percentile(cues, 0.95)} ms, max {max(cues, default='-')}")  # fmt: skip
        if wrong:
            print(f"  wrong: {', '.join(sorted(wrong))}")


if __name__ == "__main__":
    main()
