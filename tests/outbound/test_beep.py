"""A voicemail's beep (``callbridge/outbound/beep.py``, #42): tones at the frequencies machines beep at, heard through
the telephone band, μ-law and line noise, are beeps, once each, where they were; speech, backchannels, room sounds,
DTMF and noise are not."""

from __future__ import annotations

import wave
from pathlib import Path

import numpy as np
import pytest

from callbridge.codecs import pcm16_to_ulaw, ulaw_to_pcm16
from callbridge.outbound.beep import Beep, BeepDetector, BeepSettings
from callbridge.sim.caller_line import LineNoise, TelephoneBand
from callbridge.sim.runner import load_wav_8k, sample_caller_wav

pytestmark = pytest.mark.core

RATE = 8000
FRAME = 160
CORPUS = Path(__file__).resolve().parents[2] / "bench" / "corpus"


def tone(hz: float | tuple[float, ...], ms: int, level: float = 8000.0, rate: int = RATE) -> np.ndarray:
    t = np.arange(rate * ms // 1000) / rate
    return sum(level / (1 if isinstance(hz, float) else len(hz)) * np.sin(2 * np.pi * f * t) for f in ((hz,) if isinstance(hz, float) else hz))  # type: ignore[return-value]


def line(*pieces: np.ndarray, noise_db: float | None = 30.0, band: bool = True, rate: int = RATE) -> list[bytes]:
    """The pieces one after another, as the callee's line carries them: the band, line noise, μ-law; 20 ms frames."""
    audio = np.concatenate(pieces)
    frame = rate // 50
    audio = np.pad(audio, (0, -len(audio) % frame))
    frames = [np.clip(audio[i : i + frame], -32768, 32767).astype("<i2").tobytes() for i in range(0, len(audio), frame)]
    if rate != RATE:
        return frames
    filtering, noise = TelephoneBand(), LineNoise(noise_db) if noise_db is not None else None
    out = []
    for pcm in frames:
        pcm = filtering.frame(pcm) if band else pcm
        if noise is not None:
            pcm = (np.frombuffer(pcm, "<i2").astype(np.int32) + np.frombuffer(noise.frame(), "<i2")).clip(-32768, 32767).astype("<i2").tobytes()
        out.append(ulaw_to_pcm16(pcm16_to_ulaw(pcm)))
    return out


def beeps(frames: list[bytes], rate: int = RATE, settings: BeepSettings | None = None) -> list[Beep]:
    detector = BeepDetector(rate, settings)
    return [beep for k, pcm in enumerate(frames) if (beep := detector.frame(pcm, k * 20)) is not None]


def silence(ms: int) -> np.ndarray:
    return np.zeros(RATE * ms // 1000)


@pytest.mark.parametrize("hz", [440.0, 850.0, 1000.0, 1400.0, 2000.0])
@pytest.mark.parametrize("ms", [160, 400, 1000])
def test_a_beep_is_heard_once_where_it_was_through_the_line(hz: float, ms: int) -> None:
    (beep,) = beeps(line(silence(500), tone(hz, ms, level=3000.0), silence(500)))
    assert abs(beep.start_ms - 500) <= 40 and abs(beep.end_ms - (500 + ms)) <= 40, beep
    assert abs(beep.frequency_hz - hz) <= 15, beep


def test_a_beep_after_a_greeting_is_heard_at_its_end() -> None:
    """A voicemail greeting (the bundled utterance), a moment's silence, the beep: one beep, after the greeting."""
    greeting = np.frombuffer(load_wav_8k(sample_caller_wav()), dtype="<i2").astype(np.float64)
    greeting_ms = len(greeting) * 1000 // RATE
    (beep,) = beeps(line(greeting, silence(300), tone(1000.0, 500), silence(200)))
    assert abs(beep.start_ms - (greeting_ms + 300)) <= 40 and abs(beep.end_ms - (greeting_ms + 800)) <= 40


def test_a_two_tone_beep_is_one_beep() -> None:
    (beep,) = beeps(line(silence(200), tone(1000.0, 300), tone(1400.0, 200), silence(300)))
    assert abs(beep.start_ms - 200) <= 40 and abs(beep.end_ms - 700) <= 40 and abs(beep.frequency_hz - 1000) <= 15


def test_a_quiet_beep_in_loud_line_noise_is_heard() -> None:
    (beep,) = beeps(line(silence(300), tone(1000.0, 300, level=800.0), silence(300), noise_db=45.0))  # 13 dB over it
    assert abs(beep.start_ms - 300) <= 40 and abs(beep.end_ms - 600) <= 40


def test_tones_too_short_for_a_beep_are_not_chained_into_one() -> None:
    """Tonal stretches of 40 ms at changing pitches, a frame apart (a door's thud): no beep however many."""
    stretches = [piece for k in range(8) for piece in (tone(350.0 + 40 * k, 40), silence(20))]
    assert beeps(line(silence(200), *stretches, silence(200), noise_db=None, band=False)) == []


def test_a_glide_is_no_beep() -> None:
    """A near-pure tone whose pitch glides 5 Hz a frame (a vowel through the telephone band): no beep."""
    t = np.arange(RATE * 400 // 1000) / RATE
    glide = 3000.0 * np.sin(2 * np.pi * (420.0 * t - 125.0 * t * t))  # 420 Hz falling 250 Hz a second
    assert beeps(line(silence(200), glide, silence(200))) == []


def test_a_tone_sounding_says_so_before_it_ends() -> None:
    detector = BeepDetector()
    frames = line(silence(100), tone(1000.0, 300))
    for k, pcm in enumerate(frames):
        assert detector.frame(pcm, k * 20) is None
    assert 260 <= detector.tone_ms <= 320


def test_a_tone_too_short_a_dtmf_digit_and_noise_are_no_beep() -> None:
    assert beeps(line(silence(200), tone(1000.0, 80), silence(300))) == []
    assert beeps(line(silence(200), tone((697.0, 1209.0), 200), silence(100), tone((941.0, 1336.0), 200), silence(300))) == []
    assert beeps(line(silence(3000), noise_db=45.0)) == []


@pytest.mark.parametrize("name", sorted(path.stem for path in CORPUS.glob("*.wav")))
def test_speech_backchannels_and_room_sounds_are_no_beep(name: str) -> None:
    with wave.open(str(CORPUS / f"{name}.wav")) as wav:
        audio = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.float64)
    assert beeps(line(audio)) == [] and beeps(line(audio, noise_db=None, band=False)) == []


def test_the_bundled_utterance_is_no_beep() -> None:
    speech = np.frombuffer(load_wav_8k(sample_caller_wav()), dtype="<i2").astype(np.float64)
    assert beeps(line(speech)) == []


def test_a_wideband_line_hears_a_beep_too() -> None:
    (beep,) = beeps(line(np.zeros(16000 // 2), tone(1400.0, 300, rate=16000), np.zeros(16000 // 2), rate=16000), rate=16000)
    assert abs(beep.start_ms - 500) <= 40 and abs(beep.end_ms - 800) <= 40 and abs(beep.frequency_hz - 1400) <= 15


def test_settings_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError):
        BeepSettings(low_hz=3000, high_hz=300)
    with pytest.raises(ValueError, match="160 samples"):
        BeepDetector().frame(bytes(100), 0)
