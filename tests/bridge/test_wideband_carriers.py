"""The websocket carriers whose stream carries L16 at 16 kHz are wideband end to end (#43): nothing on the way narrows
the call to 8 kHz. A wideband caller (the bundled utterance at 16 kHz with a 6 kHz tone under it, which G.711 cannot
carry) on Vonage, jambonz and Plivo's L16: the tone reaches the engine, and the echo agent's reply, tone and all,
reaches the carrier with its energy above 4 kHz. Twilio (μ-law at 8 kHz) is the control: no tone at the engine."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from callbridge.codecs import ResamplerQuality, StreamResampler
from callbridge.engine.commands import AppendAudio
from callbridge.sim.carrier import CallerScript, SimStream
from callbridge.sim.runner import load_wav_8k, running_bridge, sample_caller_wav
from tests.bridge.twilio_e2e import engine, settings

TONE_HZ = 6000

CARRIERS: dict[str, dict[str, Any]] = {
    "vonage": {},  # vonage.audio_rate_hz: 16000 by default
    "jambonz": {},  # jambonz.sample_rate_hz: 16000 by default
    "plivo": {"plivo": {"content_type": "audio/x-l16;rate=16000"}},
}


def _wideband_caller() -> tuple[bytes, bytes]:
    """(the utterance at 8 kHz, for the script's turn; the same at 16 kHz with the 6 kHz tone under it)."""
    speech_8k = load_wav_8k(sample_caller_wav())
    up = StreamResampler(8000, 16000, ResamplerQuality.HQ)
    speech = np.frombuffer(up.process(speech_8k) + up.flush(), dtype="<i2").astype(np.float64)
    whistle = 1500 * np.sin(2 * np.pi * TONE_HZ * np.arange(len(speech)) / 16000)
    silence_before = bytes(300 * 32)  # the utterance starts 300 ms in, as the script says
    return speech_8k, silence_before + np.clip(speech + whistle, -32768, 32767).astype("<i2").tobytes()


def band_share(pcm: bytes, rate_hz: int, low_hz: float, high_hz: float) -> float:
    spectrum = np.abs(np.fft.rfft(np.frombuffer(pcm, dtype="<i2").astype(np.float64))) ** 2
    hz = np.fft.rfftfreq(len(pcm) // 2, 1 / rate_hz)
    return float(spectrum[(hz >= low_hz) & (hz <= high_hz)].sum() / spectrum.sum())


@pytest.mark.parametrize("provider", [*CARRIERS, "twilio"])
async def test_a_wideband_caller_reaches_the_engine_and_hears_the_agent_wideband(provider: str, monkeypatch: pytest.MonkeyPatch) -> None:
    agent_audio: list[tuple[int, bytes]] = []
    enqueue = SimStream.enqueue_audio

    def heard(stream: SimStream, pcm: bytes) -> None:
        agent_audio.append((stream.rate_hz, bytes(pcm)))
        enqueue(stream, pcm)

    monkeypatch.setattr(SimStream, "enqueue_audio", heard)
    speech_8k, wideband = _wideband_caller()
    recorder = engine()
    async with running_bridge(settings(**CARRIERS.get(provider, {})), recorder, provider=provider) as bridge:
        result = await bridge.carrier.place_call(CallerScript(utterances=((300, speech_8k),), wideband=wideband, hangup_at_ms=9000))
    assert not result.warnings, result.warnings
    (session_id,) = recorder.opened
    appended = [c for c in recorder.commands[session_id] if isinstance(c, AppendAudio)]
    at_engine = b"".join(c.pcm for c in appended)
    engine_rate = appended[0].rate_hz
    tone_at_engine = band_share(at_engine, engine_rate, TONE_HZ - 200, TONE_HZ + 200)
    (rate_hz,) = {rate for rate, _ in agent_audio}
    reply = b"".join(pcm for _, pcm in agent_audio)
    assert result.agent_speech_ms >= 2000, result.render()  # the echo of the 3.7 s utterance
    above = band_share(reply, rate_hz, 4000, 8000)
    if provider == "twilio":  # the control: an 8 kHz leg carries nothing of 6 kHz either way
        assert rate_hz == 8000 and tone_at_engine < 0.001, tone_at_engine
        return
    assert (engine_rate, rate_hz) == (16000, 16000)
    assert tone_at_engine > 0.05, tone_at_engine  # 0.12 in a run (the tone is 12 % of what the caller sent)
    assert above > 0.05, above  # the agent's voice reached the carrier wideband (0.12 in a run)
