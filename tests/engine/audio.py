"""Test audio: the recorded caller utterance, tones and silence as PCM16 bytes, and a scripted VAD scorer."""

from __future__ import annotations

import functools
import wave
from pathlib import Path

import numpy as np

from callbridge.engine.local.vad import FrameScorer

DATA = Path(__file__).resolve().parent.parent / "data"


@functools.cache
def caller_speech_16k() -> bytes:
    """3.7 s of speech (espeak-ng: "Hello, I would like to book a table for two tonight."), PCM16 16 kHz."""
    with wave.open(str(DATA / "caller_16k.wav")) as wav:
        assert wav.getframerate() == 16000 and wav.getnchannels() == 1 and wav.getsampwidth() == 2
        return wav.readframes(wav.getnframes())


def silence(ms: int, rate_hz: int = 16000) -> bytes:
    return bytes(rate_hz * ms // 1000 * 2)


def tone(ms: int, rate_hz: int = 16000, freq_hz: float = 300.0, amplitude: int = 8000) -> bytes:
    t = np.arange(rate_hz * ms // 1000) / rate_hz
    return (np.sin(2 * np.pi * freq_hz * t) * amplitude).astype("<i2").tobytes()


def chunks(pcm: bytes, rate_hz: int = 16000, chunk_ms: int = 20) -> list[bytes]:
    size = rate_hz * chunk_ms // 1000 * 2
    return [pcm[i : i + size] for i in range(0, len(pcm), size)]


class LoudnessScorer(FrameScorer):
    """A deterministic stand-in for Silero: a frame is speech when it is loud (RMS ≥ 0.05 of full scale)."""

    def score(self, frame: np.ndarray) -> float:
        return 0.95 if float(np.sqrt(np.mean(frame.astype(np.float64) ** 2))) >= 0.05 else 0.02
