"""The simulated caller's line (``sim/caller_line.py``, #41): the agent's echo comes back as late and as weak as the
script says, and a backchannel is said where it is timed."""

from __future__ import annotations

import audioop

import numpy as np
import pytest

from callbridge.sim.caller_line import FRAME_BYTES, CallerLine, TelephoneBand, backchannel_piece, echo_of, mixed

pytestmark = pytest.mark.core


def tone_8k(ms: int) -> bytes:
    t = np.arange(ms * 8) / 8000
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype("<i2").tobytes()


def samples(pcm: bytes) -> np.ndarray:
    return np.frombuffer(pcm, dtype="<i2").astype(np.float64)


def test_the_echo_is_what_was_heard_delay_ms_earlier_down_by_db() -> None:
    heard = bytes(3200) + tone_8k(400)  # silence for 200 ms, then the agent
    assert echo_of(heard, 200, delay_ms=100, down_db=10) == bytes(FRAME_BYTES)  # the agent's audio is not back yet
    echo = samples(echo_of(heard, 300, delay_ms=100, down_db=10))
    original = samples(heard[200 * 16 : 200 * 16 + FRAME_BYTES])
    assert np.allclose(echo, original * 10 ** (-10 / 20), atol=1.5)


def test_an_echo_from_before_the_call_or_past_what_was_heard_is_silence() -> None:
    heard = tone_8k(100)
    assert echo_of(heard, 0, delay_ms=400, down_db=6) == bytes(FRAME_BYTES)
    assert echo_of(heard, 90, delay_ms=0, down_db=6)[FRAME_BYTES // 2 :] == bytes(FRAME_BYTES // 2)  # 10 ms heard, then none
    assert len(echo_of(heard, 10, delay_ms=0, down_db=6)) == FRAME_BYTES


def test_mixing_adds_and_saturates() -> None:
    loud = np.full(160, 30000, dtype="<i2").tobytes()
    assert samples(mixed(loud, loud)).max() == 32767


def test_a_backchannel_is_said_after_the_agent_is_first_heard_for_its_length() -> None:
    speech = tone_8k(1000)
    said = [backchannel_piece(t, 1000, (500,), 300, speech) for t in range(0, 3000, 20)]
    pieces = [(i * 20, piece, begins) for i, (piece, begins) in enumerate(said) if piece]
    assert [t for t, _, _ in pieces] == list(range(1500, 1800, 20))
    assert [t for t, _, begins in pieces if begins] == [1500]
    assert pieces[0][1] == speech[:FRAME_BYTES]


def test_line_noise_is_at_its_level_and_the_same_every_run() -> None:
    from callbridge.bridge.echo_gate import level_db
    from callbridge.sim.caller_line import LineNoise

    first, second = LineNoise(30.0), LineNoise(30.0)
    frames = [first.frame() for _ in range(50)]
    assert frames == [second.frame() for _ in range(50)]
    levels = sorted(level_db(frame) for frame in frames)
    assert abs(levels[len(levels) // 2] - 30.0) < 0.5 and levels[0] > 27 and levels[-1] < 33, levels  # 160 samples a frame: it varies


def band_energy(pcm: bytes, low_hz: float, high_hz: float) -> float:
    spectrum = np.abs(np.fft.rfft(samples(pcm))) ** 2
    freqs = np.fft.rfftfreq(len(pcm) // 2, 1 / 8000)
    return float(spectrum[(freqs >= low_hz) & (freqs <= high_hz)].sum())


def test_the_telephone_band_keeps_speech_frequencies_and_takes_out_the_rest() -> None:
    t = np.arange(8000) / 8000
    low, mid = np.sin(2 * np.pi * 100 * t) * 6000, np.sin(2 * np.pi * 1000 * t) * 6000
    pcm = (low + mid).astype("<i2").tobytes()
    band = TelephoneBand()
    out = b"".join(band.frame(pcm[k : k + FRAME_BYTES]) for k in range(0, len(pcm), FRAME_BYTES))
    settled = out[FRAME_BYTES * 5 :]  # past the first frames
    source = pcm[FRAME_BYTES * 5 :]
    assert band_energy(settled, 50, 200) < band_energy(source, 50, 200) / 100  # 100 Hz: down by more than 20 dB
    assert band_energy(settled, 900, 1100) > band_energy(source, 900, 1100) * 0.7  # 1 kHz: kept


def test_the_callers_line_adds_the_room_and_the_echo_to_their_voice() -> None:
    room = tone_8k(200)
    line = CallerLine(echo_db=10, echo_delay_ms=100, room=(room, 20))
    heard = tone_8k(400)
    frame = line.frame(bytes(FRAME_BYTES), heard, 200)  # the caller silent: the room 20 dB down, the echo 10 dB down
    expected = mixed(audioop.mul(room[200 * 16 % (len(room) - FRAME_BYTES) :][:FRAME_BYTES], 2, 0.1), echo_of(heard, 200, delay_ms=100, down_db=10))
    assert frame == expected
    assert CallerLine().frame(tone_8k(20), heard, 200) == tone_8k(20)  # a clean line: their voice as it is
