"""Bridge-mode barge-in's decision in a closed loop (``bridge/interruption_judge.py``, #41): a line where the agent's
reply plays frame by frame unless the judge has paused it, comes back as echo, and the caller says what the case
says — the agent's echo never stops it, a backchannel pauses and resumes it with nothing of the reply lost or
repeated, a real interruption is confirmed from its onset, over an echo too."""

from __future__ import annotations

import wave
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from callbridge.bridge.echo_gate import level_db
from callbridge.bridge.interruption import Confirm, InterruptionSettings, Pause, Resume, Verdict
from callbridge.bridge.interruption_judge import InterruptionJudge
from callbridge.sim.caller_line import CallerLine, mixed
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


def call(
    says: list[tuple[int, int, int]], *, echo_db: float | None = None, echo_delay_ms: int = 100, until_ms: int = 7000,
    pieces: Sequence[tuple[int, bytes]] = (), band: bool = False, noise_db: float | None = None, room: tuple[bytes, float] | None = None,
    turn: bytes = b"",
) -> Line:  # fmt: skip
    """``says``: (at_ms, from_ms, length_ms): the caller says ``CALLER[from_ms:]`` for ``length_ms`` at ``at_ms``;
    ``pieces``: (at_ms, pcm): a sound of the caller's from ``at_ms`` (the corpus's voices, a cough). The line: the
    agent's echo (``echo_db`` down, ``echo_delay_ms`` late), ``room`` (pcm, dB down: voices in the caller's room,
    from the call's start, again and again), ``noise_db`` of line noise, and all of it through the telephone band
    where ``band``. ``turn``: what the caller said before the reply (from 0, at most ``REPLY_AT_MS``), its line
    given to the judge as the reply starts (``InterruptionJudge.caller_said``, as the bridge does)."""
    judge, line, heard = InterruptionJudge(), Line(), bytearray()
    position, paused_since = 0, None
    callers_line = CallerLine(echo_db=echo_db, echo_delay_ms=echo_delay_ms, noise_db=noise_db, room=room, band=band)
    pieces = [(0, turn[: REPLY_AT_MS * 16]), *pieces] if turn else pieces
    sent = bytearray()
    for k in range(until_ms // 20):
        t = k * 20
        if t == REPLY_AT_MS and turn:
            judge.caller_said(bytes(sent), 8000)
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
        for at, pcm in pieces:
            if at <= t < at + len(pcm) // 16:
                near = mixed(near, pcm[(t - at) * 16 : (t - at) * 16 + FRAME].ljust(FRAME, b"\x00"))
        near = callers_line.frame(near, heard, t)
        sent += near
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


@pytest.mark.parametrize("length_ms", [260, 450])
@pytest.mark.parametrize("echo_db", [None, 10.0])
def test_a_backchannel_pauses_and_resumes_the_reply_with_nothing_lost_or_repeated(length_ms: int, echo_db: float | None) -> None:
    line = call([(REPLY_AT_MS + 1000, 1500, length_ms)], echo_db=echo_db)
    assert kinds(line) == [Pause, Resume] and whole_reply(line)
    # the silence it leaves: from ``pause_after_ms`` into the backchannel (the pause) to ``resume_after_silence_ms``
    # after it (the resume; ``gap_ms`` where longer after one as long as the longest backchannel, 300 ms, or
    # longer: the caller may be between two words)
    policy = InterruptionSettings()
    assert line.paused_ms[0] <= length_ms - policy.pause_after_ms + policy.resume_after_ms(length_ms) + 40, line.paused_ms


@pytest.mark.parametrize(("from_ms", "echo_db"), [(1000, 20.0), (2000, 10.0), (2000, 20.0)])
def test_a_caller_over_an_echo_the_gate_has_not_learnt_yet_is_still_confirmed(from_ms: int, echo_db: float) -> None:
    """1 s into the reply over a 400 ms echo (the path not yet learnt): the caller's quieter syllables between the
    peaks the gate hears must not teach it a smaller loss (it would hear them less and less), and the echo's tail
    in the pause must not pass for silence (the reply would resume over them)."""
    onset = REPLY_AT_MS + 1000
    line = call([(onset, from_ms, 1500)], echo_db=echo_db, echo_delay_ms=400)
    assert kinds(line)[:2] == [Pause, Confirm], line.verdicts
    assert line.verdicts[0][0] - onset <= 300


def test_a_backchannel_early_in_the_reply_leaves_the_gate_taking_the_echo_for_echo() -> None:
    """0.5 s in, over an echo not yet learnt: the pause leaves the line quiet where the agent was heard before it
    (its echo's source silent), which must not teach the gate a line with little echo — after the resume the echo
    would be taken for the caller, pause after pause, and end in a barge-in nobody made."""
    for echo_db, delay_ms in ((10.0, 200), (20.0, 400)):
        line = call([(REPLY_AT_MS + 500, 1500, 300)], echo_db=echo_db, echo_delay_ms=delay_ms)
        assert kinds(line) in ([], [Pause, Resume]) and whole_reply(line), line.verdicts


def test_voices_in_the_callers_room_neither_hold_a_pause_nor_confirm_it() -> None:
    """Another voice 20 dB under the caller, all call long: louder than ``speech_db``, so without the caller's own
    level it holds the pause a backchannel made and is confirmed as theirs; with it (their turn before the reply,
    ``InterruptionJudge.caller_said``) it is not theirs, and the reply resumes whole."""
    room, turn, okay = (corpus("room-voices"), 20.0), corpus("say-0-f2"), [(REPLY_AT_MS + 1500, corpus("bc-okay-f2"))]
    unknown = call([], pieces=okay, room=room)
    assert Confirm in kinds(unknown)  # what the caller's level is for
    line = call([], pieces=okay, room=room, turn=turn)
    assert kinds(line) == [Pause, Resume] and whole_reply(line), line.verdicts


def first_sound_ms(pcm: bytes, speech_db: float = 45.0) -> int:
    """Where the first 20 ms frame of ``pcm`` (8 kHz) at ``speech_db`` or more starts: a sound's true onset."""
    return next(k * 20 for k in range(len(pcm) // FRAME) if level_db(pcm[k * FRAME : (k + 1) * FRAME]) >= speech_db)


def last_sound_ms(pcm: bytes, speech_db: float = 45.0) -> int:
    """Where the last 20 ms frame of ``pcm`` (8 kHz) at ``speech_db`` or more ends."""
    return max(k * 20 + 20 for k in range(len(pcm) // FRAME) if level_db(pcm[k * FRAME : (k + 1) * FRAME]) >= speech_db)


def corpus(name: str) -> bytes:
    """A sound of ``bench/corpus`` (``make_corpus.py``: espeak-ng voices, room sounds; 8 kHz PCM16)."""
    with wave.open(str(Path(__file__).resolve().parents[2] / "bench" / "corpus" / f"{name}.wav")) as w:
        return w.readframes(w.getnframes())


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
