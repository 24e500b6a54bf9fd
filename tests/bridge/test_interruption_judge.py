"""Bridge-mode barge-in's decision in a closed loop (``bridge/interruption_judge.py``, #41): a line where the agent's
reply plays frame by frame unless the judge has paused it, comes back as echo, and the caller says what the case
says — the agent's echo never stops it, a backchannel pauses and resumes it with nothing of the reply lost or
repeated, a real interruption is confirmed from its onset, over an echo too."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from callbridge.bridge.interruption import Confirm, Pause, Resume, Verdict
from callbridge.bridge.interruption_judge import InterruptionJudge
from callbridge.sim.caller_line import echo_of, mixed
from callbridge.sim.runner import load_wav_8k, sample_caller_wav

pytestmark = pytest.mark.core


REPLY = load_wav_8k(sample_caller_wav())  # the agent's reply: 3.7 s of speech
CALLER = np.frombuffer(REPLY, dtype="<i2")[::-1].tobytes()  # what the caller says: speech, not the agent's words
REPLY_AT_MS = 1000
FRAME = 320


@dataclass
class Line:
    verdicts: list[tuple[int, Verdict]] = field(default_factory=list)
    played: list[int] = field(default_factory=list)
    """The reply's offset (bytes) of each frame the caller heard of it, in order."""
    paused_ms: list[int] = field(default_factory=list)
    stopped_at_ms: int | None = None


def call(says: list[tuple[int, int, int]], *, echo_db: float | None = None, echo_delay_ms: int = 100, until_ms: int = 7000) -> Line:
    """``says``: (at_ms, from_ms, length_ms): the caller says ``CALLER[from_ms:]`` for ``length_ms`` at ``at_ms``."""
    judge, line, heard = InterruptionJudge(), Line(), bytearray()
    position, paused_since = 0, None
    for k in range(until_ms // 20):
        t = k * 20
        playing = t >= REPLY_AT_MS and paused_since is None and line.stopped_at_ms is None and position < len(REPLY)
        frame = REPLY[position : position + FRAME].ljust(FRAME, b"\x00") if playing else bytes(FRAME)
        if playing:
            line.played.append(position)
            position += FRAME
        heard += frame
        judge.heard(frame)
        near = bytes(FRAME)
        for at, start, length in says:
            if at <= t < at + length:
                offset = (start + t - at) * 16
                near = CALLER[offset : offset + FRAME].ljust(FRAME, b"\x00")
        if echo_db is not None:
            near = mixed(near, echo_of(heard, t, delay_ms=echo_delay_ms, down_db=echo_db))
        verdict = judge.caller(near, t)
        if verdict is None:
            continue
        line.verdicts.append((t + 20, verdict))
        if isinstance(verdict, Pause):
            paused_since = t + 20
        elif isinstance(verdict, Resume):
            assert paused_since is not None
            line.paused_ms.append(t + 20 - paused_since)
            paused_since = None
        elif isinstance(verdict, Confirm):
            line.stopped_at_ms = t + 20
    return line


def kinds(line: Line) -> list[type]:
    return [type(verdict) for _, verdict in line.verdicts]


def whole_reply(line: Line) -> bool:
    """Every frame of the reply heard once, in order: nothing lost, nothing repeated."""
    return line.played == list(range(0, len(REPLY) - len(REPLY) % FRAME + (FRAME if len(REPLY) % FRAME else 0), FRAME))


@pytest.mark.parametrize("echo_db", [6, 10, 20, 30])
@pytest.mark.parametrize("delay_ms", [60, 200, 400])
def test_the_agents_own_echo_never_stops_it(echo_db: int, delay_ms: int) -> None:
    line = call([], echo_db=echo_db, echo_delay_ms=delay_ms)
    assert kinds(line) == [] and whole_reply(line)


@pytest.mark.parametrize("length_ms", [300, 450])
@pytest.mark.parametrize("echo_db", [None, 10.0])
def test_a_backchannel_pauses_and_resumes_the_reply_with_nothing_lost_or_repeated(length_ms: int, echo_db: float | None) -> None:
    line = call([(REPLY_AT_MS + 1000, 1500, length_ms)], echo_db=echo_db)
    assert kinds(line) == [Pause, Resume] and whole_reply(line)
    # the silence it leaves: from 160 ms into the backchannel (the pause) to 200 ms after it (the resume)
    assert line.paused_ms[0] <= length_ms - 160 + 200 + 40, line.paused_ms


@pytest.mark.parametrize(("from_ms", "echo_db"), [(1000, 20.0), (2000, 10.0), (2000, 20.0)])
def test_a_caller_over_an_echo_the_gate_has_not_learnt_yet_is_still_confirmed(from_ms: int, echo_db: float) -> None:
    """1 s into the reply over a 400 ms echo (the path not yet learnt): the caller's quieter syllables between the
    peaks the gate hears must not teach it a smaller loss (it would hear them less and less), and the echo's tail
    in the pause must not pass for silence (the reply would resume over them)."""
    onset = REPLY_AT_MS + 1000
    line = call([(onset, from_ms, 1500)], echo_db=echo_db, echo_delay_ms=400)
    assert kinds(line)[:2] == [Pause, Confirm], line.verdicts
    assert line.verdicts[0][0] - onset <= 300


def test_a_cough_does_not_even_pause_it() -> None:
    line = call([(REPLY_AT_MS + 1000, 1500, 100)], echo_db=10)
    assert kinds(line) == [] and whole_reply(line)


@pytest.mark.parametrize("echo_db", [None, 10.0, 20.0])
@pytest.mark.parametrize("after_ms", [1000, 2000])
def test_a_real_interruption_is_confirmed_from_its_onset_over_an_echo_too(after_ms: int, echo_db: float | None) -> None:
    onset = REPLY_AT_MS + after_ms
    line = call([(onset, 1500, 2000)], echo_db=echo_db)
    assert kinds(line) == [Pause, Confirm], line.verdicts
    (paused_at, _), (_, confirm) = line.verdicts
    assert isinstance(confirm, Confirm) and abs(confirm.onset_ms - onset) <= 60  # the words go to the engine from here
    assert paused_at - onset <= 200  # agent audio heard after the onset
