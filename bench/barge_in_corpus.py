"""Bridge-mode barge-in's decision core over the corpus (#41): synthetic voices, backchannels, room sounds and
telephone lines, on the closed-loop line of ``tests/bridge/test_interruption_judge.py`` (no server, no engine).

    python bench/barge_in_corpus.py

The agent's reply is the bundled utterance (3.7 s, from 1 s); what the caller's line sends is mixed from
``bench/corpus/`` (``make_corpus.py``: five espeak-ng voices, five backchannels each, three interrupting sentences
each, a cough, a click, a door, typing, voices in the room). Lines: the agent's echo (-6 to -30 dB, 20–400 ms),
flat or through the telephone band (300–3400 Hz) with line noise at 30 dB. Printed per kind: calls, pauses and
confirmations (a confirmation is a barge-in); for backchannels whether the reply was heard whole (nothing lost or
repeated), the silence each pause left and the dead air from the caller's last sound to the resume; for
interruptions how many were confirmed, the agent heard after the true onset (the sound's first frame at 45 dB or
more) up to the confirmation, and whether the words went to the engine from their onset (the resend starts
``RESEND_BEFORE_ONSET_MS`` before the confirmation's onset).
"""

from __future__ import annotations

import itertools
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from callbridge.bridge.bridge_barge_in import RESEND_BEFORE_ONSET_MS  # noqa: E402
from callbridge.bridge.interruption import Confirm, Pause, Resume  # noqa: E402
from tests.bridge.test_interruption_judge import (  # noqa: E402
    REPLY,
    REPLY_AT_MS,
    Line,
    call,
    first_sound_ms,
    last_sound_ms,
    whole_reply,
)
from tests.bridge.test_interruption_judge import corpus as sound  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "corpus"
LINES: dict[str, dict[str, object]] = {
    "no echo": {},
    "echo -10 dB 200 ms": {"echo_db": 10.0, "echo_delay_ms": 200},
    "echo -20 dB 400 ms": {"echo_db": 20.0, "echo_delay_ms": 400},
    "band+noise, echo -10 dB 60 ms": {"echo_db": 10.0, "echo_delay_ms": 60, "band": True, "noise_db": 30.0},
    "room voices -20 dB, echo -20 dB 200 ms": {"echo_db": 20.0, "echo_delay_ms": 200},
}


ROOM = sound("room-voices")


def line_of(name: str, sound_name: str) -> dict[str, object]:
    """The line's options, and the caller's turn before the reply: 0.9 s of a sentence in the sound's voice (a
    room sound's: the first voice's)."""
    options = dict(LINES[name])
    if name.startswith("room"):
        options["room"] = (ROOM, 20.0)
    kind, *_, voice = sound_name.split("-")
    said = f"say-{(int(sound_name.split('-')[1]) + 1) % 3}-{voice}" if kind == "say" else f"say-0-{voice}" if kind == "bc" else "say-0-m3"
    options["turn"] = sound(said)  # another sentence, for an interruption
    return options


def percentile(values: list[int], share: float) -> int | str:
    """The nearest-rank percentile (``share`` 0–1) of ``values``; "-" where there are none."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))] if ordered else "-"


def heard_after_onset(line: Line, onset_ms: int) -> int:
    """How much of the agent the caller heard from ``onset_ms`` to the confirmation: to the first pause, and from
    each resume to the next pause."""
    heard, playing_since = 0, onset_ms
    for at, verdict in line.verdicts:
        if at < onset_ms:
            continue
        if isinstance(verdict, Resume):
            playing_since = at
        elif playing_since is not None:
            heard += at - playing_since
            playing_since = None
        if isinstance(verdict, Confirm):
            break
    return heard


def heard_ms(line: Line) -> int:
    return len(line.played) * 20


def main() -> None:
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}\n")
    reply_ms = len(REPLY) // 16
    names = sorted(path.stem for path in CORPUS.glob("*.wav"))
    agent_heard, false_confirms = 0, 0

    echo_cases = list(itertools.product((6.0, 10.0, 20.0, 30.0), (20, 60, 200, 300, 400), (False, True)))
    lines = [call([], echo_db=db, echo_delay_ms=delay, band=band, noise_db=30.0 if band else None) for db, delay, band in echo_cases]
    paused = sum(any(isinstance(v, Pause) for _, v in line.verdicts) for line in lines)
    confirms = sum(isinstance(v, Confirm) for line in lines for _, v in line.verdicts)
    agent_heard += sum(heard_ms(line) for line in lines)
    false_confirms += confirms
    print(f"echo alone ({len(lines)} calls: -6/-10/-20/-30 dB x 20-400 ms, flat or band+noise): paused in {paused}, "
          f"barge-ins {confirms}, reply whole in {sum(whole_reply(line) for line in lines)}")  # fmt: skip

    for kind, prefix in (("room sounds", "noise-"), ("backchannels", "bc-")):
        pieces = [name for name in names if name.startswith(prefix)]
        pauses, confirms, whole, silences, dead_air, total = 0, 0, 0, [], [], 0
        for name, at, line_name in itertools.product(pieces, (500, 1500, 2500), LINES):
            pcm = sound(name)
            line = call([], pieces=[(REPLY_AT_MS + at, pcm)], **line_of(line_name, name))  # type: ignore[arg-type]
            total += 1
            pauses += len(line.paused_ms) + sum(isinstance(v, Confirm) for _, v in line.verdicts)
            confirms += sum(isinstance(v, Confirm) for _, v in line.verdicts)
            whole += whole_reply(line)
            silences += line.paused_ms
            resumes = [t for t, v in line.verdicts if not isinstance(v, Pause)]
            dead_air += [resumes[-1] - (REPLY_AT_MS + at + last_sound_ms(pcm))] if resumes else []
            agent_heard += heard_ms(line)
        false_confirms += confirms
        print(f"{kind} ({total} calls: {len(pieces)} sounds x 3 points x {len(LINES)} lines): pauses {pauses}, "
              f"barge-ins {confirms}, reply whole in {whole}; pause silence p50 {percentile(silences, 0.5)} ms, p95 "
              f"{percentile(silences, 0.95)} ms, max {max(silences, default='-')}; dead air after the sound p50 "
              f"{percentile(dead_air, 0.5)} ms, p95 {percentile(dead_air, 0.95)} ms")  # fmt: skip

    sentences = [name for name in names if name.startswith("say-")]
    confirmed, heard_after, from_onset, total, missed, late = 0, [], 0, 0, [], []
    for name, at, line_name in itertools.product(sentences, (300, 800, 1500, 2500), LINES):
        pcm = sound(name)
        onset = REPLY_AT_MS + at + first_sound_ms(pcm)
        line = call([], pieces=[(REPLY_AT_MS + at, pcm)], **line_of(line_name, name))  # type: ignore[arg-type]
        total += 1
        kinds = [type(v) for _, v in line.verdicts]
        if Confirm not in kinds:
            missed.append((name, at, line_name))
            continue
        confirmed += 1
        heard_after.append(heard_after_onset(line, onset))
        confirm = next(v for _, v in line.verdicts if isinstance(v, Confirm))
        late.append(confirm.onset_ms - onset)
        from_onset += confirm.onset_ms - RESEND_BEFORE_ONSET_MS <= onset
        agent_heard += heard_ms(line)
    print(f"interruptions ({total} calls: {len(sentences)} sentences x 0.3/0.8/1.5/2.5 s into the reply x {len(LINES)} "
          f"lines): confirmed {confirmed} ({100 * confirmed / total:.1f} %); the words sent from their onset in {from_onset} "
          f"(the confirmation's onset after the true one p50 {percentile(late, 0.5)} ms, p95 {percentile(late, 0.95)} ms, "
          f"the resend starts {RESEND_BEFORE_ONSET_MS} ms before it); agent heard after the onset p50 "
          f"{percentile(heard_after, 0.5)} ms, p95 {percentile(heard_after, 0.95)} ms")  # fmt: skip
    for case in missed:
        print(f"  missed: {case}")
    print(f"\nfalse barge-ins (every call but the interruptions): {false_confirms} in {agent_heard / 60000:.1f} min of the "
          f"agent heard ({reply_ms} ms a reply)")  # fmt: skip


if __name__ == "__main__":
    main()
