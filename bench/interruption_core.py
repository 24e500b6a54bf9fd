"""Bridge-mode barge-in's decision core on a closed-loop line (#41): the echo gate and the interruption policy
(``bridge/interruption_judge.py``) over a grid of cases, no server, no engine — what the decision alone gets right
before any of it is wired into a call.

    python bench/interruption_core.py

The line (``tests/bridge/test_interruption_judge.py``'s ``call``): the agent's reply (the bundled utterance, 3.7 s)
plays from 1 s unless paused, comes back flat at -6 to -30 dB and 0–500 ms late; the caller's speech is the
utterance reversed (speech, not the agent's words), taken from one of four offsets. Printed: echo-only calls with
any verdict (false pauses); interruptions (1.5 s of the caller's speech at 0.5–2.5 s into the reply) confirmed, and
the agent's audio heard after the true onset; backchannels (250–450 ms) resumed with the reply whole, and the
silence each pause left.
"""

from __future__ import annotations

import itertools
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from barge_in_corpus import percentile  # noqa: E402

from callbridge.bridge.interruption import Confirm, Pause  # noqa: E402
from tests.bridge.test_interruption_judge import CALLER, REPLY_AT_MS, call, first_sound_ms, last_sound_ms, whole_reply  # noqa: E402

OFFSETS_MS = (0, 500, 1000, 2000)
ECHOES_DB = (None, 10.0, 20.0, 30.0)


def first_speech_ms(start_ms: int) -> int:
    """How far into the caller's piece from ``start_ms`` its first sound is (the reversed utterance opens with the
    original's trailing silence): a true onset is the caller's first sound, not the piece's start."""
    return first_sound_ms(CALLER[start_ms * 16 :])


def last_speech_ms(start_ms: int, length_ms: int) -> int:
    """Where the caller's last sound in the piece ends (from the piece's start)."""
    return last_sound_ms(CALLER[start_ms * 16 : (start_ms + length_ms) * 16])


def main() -> None:
    print(f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}\n")
    false = [bool(call([], echo_db=db, echo_delay_ms=delay).verdicts)
             for db, delay in itertools.product((6, 10, 15, 20, 30), (0, 40, 60, 100, 200, 300, 400, 500))]  # fmt: skip
    print(f"echo only: {sum(false)} of {len(false)} calls paused at all")
    confirmed, heard_after, missed = 0, [], []
    cases = [(a, f, db, d) for a, f, db, d in itertools.product((500, 1000, 1500, 2500), OFFSETS_MS, ECHOES_DB, (60, 200, 400))
             if db is not None or d == 60]  # fmt: skip
    for after, start, db, delay in cases:
        line = call([(REPLY_AT_MS + after, start, 1500)], echo_db=db, echo_delay_ms=delay)
        kinds = [type(verdict) for _, verdict in line.verdicts]
        if kinds[:2] == [Pause, Confirm]:
            confirmed += 1
            heard_after.append(line.verdicts[0][0] - REPLY_AT_MS - after - first_speech_ms(start))
        else:
            missed.append((after, start, db, delay))
    print(f"interruptions: {confirmed} of {len(cases)} confirmed; agent heard after the onset p50 "
          f"{percentile(heard_after, 0.5)} ms, p95 {percentile(heard_after, 0.95)} ms")  # fmt: skip
    resumed, silences, dead_air, total = 0, [], [], 0
    for at, start, length, db in itertools.product((500, 1000, 2000, 3000), OFFSETS_MS, (250, 300, 400, 450), (None, 10.0, 20.0)):
        line = call([(REPLY_AT_MS + at, start, length)], echo_db=db)
        total += 1
        if Confirm not in [type(verdict) for _, verdict in line.verdicts] and whole_reply(line):
            resumed += 1
            silences += line.paused_ms
            resumes = [t for t, verdict in line.verdicts if not isinstance(verdict, Pause)]
            dead_air += [resumes[-1] - (REPLY_AT_MS + at + last_speech_ms(start, length))] if resumes else []
    print(f"backchannels: {resumed} of {total} never confirmed, the reply whole; {len(silences)} pauses, silence "
          f"p50 {percentile(silences, 0.5)} ms, p95 {percentile(silences, 0.95)} ms; from the caller's last sound to the "
          f"resume p50 {percentile(dead_air, 0.5)} ms, p95 {percentile(dead_air, 0.95)} ms")  # fmt: skip


if __name__ == "__main__":
    main()
