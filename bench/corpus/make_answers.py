"""Make the answering-machine corpus's answers (#42): how a call placed by the agent is answered — a person's
greeting, a voicemail greeting, an IVR menu — in several synthetic voices.

    python bench/corpus/make_answers.py       # needs espeak-ng (Debian: apt-get install espeak-ng)

Writes ``bench/corpus/answers/*.wav`` (8 kHz PCM16 mono, committed: the benches and tests read them without
espeak-ng), each trimmed to its speech: ``person-<n>-<voice>`` (what people say when they pick up: "Hello?",
"Yes, this is Mary."), ``machine-<n>-<voice>`` (voicemail greetings, 2–6 s, phrases and their pauses as espeak-ng
says them; three voices) and ``ivr-<n>-<voice>`` (menus, 5–8 s; two). The beep after a greeting, the silence around, the line's noise and band
are added where the corpus is used (``tests/outbound/test_answer.py``, ``bench/answering_machine.py``), so one
greeting serves many calls. Voices and levelling as ``make_corpus.py``. Synthetic voices are not people: this
gives the detector something to be measured on, it does not replace recordings of real answers.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_corpus import spoken, write  # noqa: E402

HERE = Path(__file__).resolve().parent / "answers"
VOICES = ("m3", "f2", "m1", "f4", "f5")
PERSONS = (
    "Hello?", "Hi.", "Yes?", "Hello, who is this?", "Yeah, hello.", "This is Mary.", "Hello, Smith residence.",
    "Good morning, this is David speaking.",
)  # fmt: skip
MACHINES = (
    "Hi, you've reached John. I can't take your call right now. Please leave a message after the tone.",
    "The person you are calling is not available. Please leave a message after the beep.",
    "Hello, this is Sarah. Leave your name and number and I'll call you back.",
    "You have reached the offices of Acme Dental. Our office is closed. Please leave a message.",
    "Hey, it's Mike. Leave a message.",
)
IVRS = (
    "Thank you for calling Acme. For sales, press one. For support, press two. For all other questions, stay on the line.",
    "Welcome to the city library. If you know your party's extension, you may dial it at any time.",
)


def main() -> None:
    for kind, texts in (("person", PERSONS), ("machine", MACHINES), ("ivr", IVRS)):
        for n, text in enumerate(texts):
            for voice in VOICES if kind == "person" else VOICES[:3] if kind == "machine" else VOICES[:2]:
                write(f"{kind}-{n}-{voice}", spoken(text, voice), HERE)


if __name__ == "__main__":
    main()
