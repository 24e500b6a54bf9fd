"""Silero VAD through onnxruntime, on recorded speech, silence and noise; the endpointing rules."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from callbridge.engine.local.vad import (
    SILERO_SHA256,
    SpeechBoundary,
    StreamingVad,
    shared_silero_model,
)
from callbridge.engine.port import TurnDetection
from tests.engine.audio import LoudnessScorer, caller_speech_16k, chunks, silence, tone

pytestmark = pytest.mark.core


def run(vad: StreamingVad, pcm: bytes, chunk_ms: int = 20) -> list[SpeechBoundary]:
    return [b for chunk in chunks(pcm, chunk_ms=chunk_ms) for b in vad.process(chunk)]


def test_the_model_is_the_artifact_vllm_omni_pins() -> None:
    model = shared_silero_model()
    assert hashlib.sha256(model.path.read_bytes()).hexdigest() == SILERO_SHA256


def test_speech_starts_and_stops_once() -> None:
    boundaries = run(StreamingVad(TurnDetection()), silence(1000) + caller_speech_16k() + silence(1500))
    assert [b.started for b in boundaries] == [True, False]
    start, stop = boundaries
    voiced_end_ms = 3306  # the recording's last voiced sample; espeak adds ~390 ms of trailing quiet
    assert 1000 - 300 - 100 <= start.audio_ms <= 1000  # speech onset minus the 300 ms prefix padding
    assert 1000 + voiced_end_ms + 500 <= stop.audio_ms <= 1000 + voiced_end_ms + 800  # after 500 ms of silence


@pytest.mark.parametrize("chunk_ms", [10, 20, 32, 100, 1000])
def test_boundaries_do_not_depend_on_chunk_size(chunk_ms: int) -> None:
    audio = silence(500) + caller_speech_16k() + silence(1000)
    assert run(StreamingVad(TurnDetection()), audio, chunk_ms) == run(StreamingVad(TurnDetection()), audio, 20)


def test_silence_is_not_speech() -> None:
    vad = StreamingVad(TurnDetection())
    assert run(vad, silence(3000)) == []
    assert vad.last_probability < 0.1


def test_noise_is_not_speech() -> None:
    rng = np.random.default_rng(3)
    noise = (rng.standard_normal(16000 * 3) * 1000).astype("<i2").tobytes()
    assert run(StreamingVad(TurnDetection()), noise) == []


def test_short_blip_below_min_speech_duration_is_ignored() -> None:
    params = TurnDetection(min_speech_duration_ms=200)
    vad = StreamingVad(params, LoudnessScorer())
    assert run(vad, silence(320) + tone(96) + silence(1000)) == []


def test_hysteresis_pause_shorter_than_silence_duration_keeps_the_turn() -> None:
    vad = StreamingVad(TurnDetection(silence_duration_ms=500), LoudnessScorer())
    boundaries = run(vad, tone(640) + silence(320) + tone(640) + silence(800))
    assert [b.started for b in boundaries] == [True, False]
    assert boundaries[1].audio_ms == 640 + 320 + 640 + 512  # 16 frames of 32 ms below threshold


def test_reset_forgets_the_utterance_and_keeps_the_clock() -> None:
    vad = StreamingVad(TurnDetection(prefix_padding_ms=300), LoudnessScorer())
    run(vad, silence(640) + tone(320))
    assert vad.speech_active
    vad.reset()
    assert not vad.speech_active
    (start,) = run(vad, tone(320))
    assert start.started and start.audio_ms == 960  # prefix padding cannot reach back past the reset
