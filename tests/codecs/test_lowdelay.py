"""The low-delay resampler: quality against the ideal signal, aliasing, delay, chunk independence, accounting."""

from __future__ import annotations

import numpy as np
import pytest

from callbridge.codecs import ResamplerQuality, StreamResampler
from callbridge.codecs.lowdelay import LowDelayResampler

pytestmark = pytest.mark.core

RATE_PAIRS = [(8000, 16000), (16000, 8000), (24000, 8000), (24000, 16000), (16000, 24000), (8000, 24000), (22050, 8000)]


def tone(rate_hz: int, freq_hz: float, seconds: float = 1.0, amplitude: float = 8000.0) -> np.ndarray:
    return (np.sin(2 * np.pi * freq_hz * np.arange(int(rate_hz * seconds)) / rate_hz) * amplitude).astype(np.int16)


def stream(resampler: LowDelayResampler, signal: np.ndarray, chunk: int) -> np.ndarray:
    out = b"".join(resampler.process(signal[i : i + chunk].tobytes()) for i in range(0, len(signal), chunk))
    return np.frombuffer(out, dtype=np.int16)


def snr_against_ideal(out: np.ndarray, out_rate: int, freq_hz: float, delay_samples: float, amplitude: float = 8000.0) -> float:
    ideal = np.sin(2 * np.pi * freq_hz * (np.arange(len(out)) - delay_samples) / out_rate) * amplitude
    body = slice(len(out) // 10, len(out) * 9 // 10)
    return float(10 * np.log10(np.sum(ideal[body] ** 2) / np.sum((out[body] - ideal[body]) ** 2)))


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
@pytest.mark.parametrize("freq_hz", [300.0, 1000.0, 3000.0])
def test_tones_in_the_passband_come_out_clean(in_rate: int, out_rate: int, freq_hz: float) -> None:
    resampler = LowDelayResampler(in_rate, out_rate)
    out = stream(resampler, tone(in_rate, freq_hz), in_rate // 50)
    assert snr_against_ideal(out.astype(np.float64), out_rate, freq_hz, resampler.delay_samples) >= 55


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_delay_is_a_few_ms_and_nothing_is_held_back(in_rate: int, out_rate: int) -> None:
    resampler = StreamResampler(in_rate, out_rate, ResamplerQuality.LD)
    assert LowDelayResampler(in_rate, out_rate).delay_ms <= 3.5
    chunk = tone(in_rate, 440, 0.02).tobytes()
    for _ in range(100):
        resampler.process(chunk)
        assert -1 < resampler.held_samples <= 0  # every output whose input has arrived is out


@pytest.mark.parametrize("freq_hz", [4200.0, 5000.0, 7000.0, 11000.0])
def test_aliasing_rejection_above_4khz_on_24k_to_8k(freq_hz: float) -> None:
    out = stream(LowDelayResampler(24000, 8000), tone(24000, freq_hz, amplitude=16000), 480).astype(np.float64)
    body = out[len(out) // 10 : len(out) * 9 // 10]
    rejection_db = 20 * np.log10(16000 / np.sqrt(2) / max(np.sqrt(np.mean(body**2)), 1e-9))
    assert rejection_db >= 50, f"{freq_hz} Hz folded back at only {rejection_db:.1f} dB below"


@pytest.mark.parametrize("freq_hz", [300.0, 1000.0, 2000.0, 3000.0, 3400.0])
def test_passband_is_flat_on_24k_to_8k(freq_hz: float) -> None:
    out = stream(LowDelayResampler(24000, 8000), tone(24000, freq_hz), 480).astype(np.float64)
    body = out[len(out) // 10 : len(out) * 9 // 10]
    gain_db = 20 * np.log10(np.sqrt(np.mean(body**2)) / (8000 / np.sqrt(2)))
    assert abs(gain_db) <= 0.5


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_chunking_does_not_change_the_output(in_rate: int, out_rate: int) -> None:
    rng = np.random.default_rng(5)
    signal = (rng.standard_normal(in_rate // 2) * 4000).astype(np.int16)
    whole = stream(LowDelayResampler(in_rate, out_rate), signal, len(signal)).astype(np.int32)
    for chunk in (1, 37, in_rate // 50, 1000):
        chunked = stream(LowDelayResampler(in_rate, out_rate), signal, chunk).astype(np.int32)
        assert len(chunked) == len(whole)
        assert np.abs(chunked - whole).max() <= 1  # float rounding only


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_accounting(in_rate: int, out_rate: int) -> None:
    resampler = LowDelayResampler(in_rate, out_rate)
    samples = in_rate * 3 + 7
    out = stream(resampler, np.zeros(samples, dtype=np.int16), 333)
    assert len(out) == -(-samples * out_rate // in_rate)
    tail = np.frombuffer(resampler.flush(), dtype=np.int16)
    assert resampler.delay_samples <= len(tail) <= resampler.delay_samples + out_rate / in_rate + 2


def test_an_impulse_comes_out_after_the_group_delay() -> None:
    resampler = LowDelayResampler(8000, 16000)
    impulse = np.zeros(800, dtype=np.int16)
    impulse[400] = 16000
    out = stream(resampler, impulse, 160)
    assert int(np.argmax(np.abs(out))) == pytest.approx(800 + resampler.delay_samples, abs=1)


def test_odd_byte_chunk_rejected() -> None:
    with pytest.raises(ValueError, match="whole samples"):
        LowDelayResampler(8000, 16000).process(b"\x00\x00\x00")
