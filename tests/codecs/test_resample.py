"""Streaming resampling: chunked equals one-shot, and every sample is accounted for."""

from __future__ import annotations

import numpy as np
import pytest
import soxr

from callbridge.codecs import PCM16_SAMPLE_BYTES, ResamplerQuality, StreamResampler

pytestmark = pytest.mark.core

RATE_PAIRS = [(8000, 16000), (16000, 8000), (24000, 8000), (24000, 16000), (22050, 8000)]
CHUNK_MS = 20


def sine(rate_hz: int, seconds: float, freq_hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(rate_hz * seconds)) / rate_hz
    return (np.sin(2 * np.pi * freq_hz * t) * 12000).astype(np.int16)


def chirp(rate_hz: int, seconds: float, top_hz: float) -> np.ndarray:
    """Linear sweep from 100 Hz to ``top_hz`` (kept under both Nyquists)."""
    t = np.arange(int(rate_hz * seconds)) / rate_hz
    phase = 2 * np.pi * (100 * t + (top_hz - 100) * t**2 / (2 * seconds))
    return (np.sin(phase) * 12000).astype(np.int16)


def stream_in_chunks(resampler: StreamResampler, signal: np.ndarray, chunk_samples: int) -> np.ndarray:
    parts = [resampler.process(signal[i : i + chunk_samples].tobytes()) for i in range(0, len(signal), chunk_samples)]
    parts.append(resampler.flush())
    return np.frombuffer(b"".join(parts), dtype=np.int16)


def aligned_snr_db(reference: np.ndarray, test: np.ndarray, max_lag: int = 64) -> tuple[float, int]:
    """SNR of ``test`` against ``reference`` at the lag (|lag| ≤ max_lag) that maximises it."""
    best = (-np.inf, 0)
    ref = reference.astype(np.float64)
    tst = test.astype(np.float64)
    for lag in range(-max_lag, max_lag + 1):
        a = ref[max(lag, 0) :]
        b = tst[max(-lag, 0) :]
        n = min(len(a), len(b))
        noise = np.sum((a[:n] - b[:n]) ** 2)
        snr = np.inf if noise == 0 else 10 * np.log10(np.sum(a[:n] ** 2) / noise)
        best = max(best, (snr, lag))
    return best


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
@pytest.mark.parametrize("kind", ["sine", "chirp"])
def test_chunked_matches_one_shot(in_rate: int, out_rate: int, kind: str) -> None:
    top_hz = 0.45 * min(in_rate, out_rate)
    signal = sine(in_rate, 1.0) if kind == "sine" else chirp(in_rate, 1.0, top_hz)
    streamed = stream_in_chunks(StreamResampler(in_rate, out_rate), signal, in_rate * CHUNK_MS // 1000)
    one_shot = soxr.resample(signal, in_rate, out_rate, quality="HQ")
    snr, lag = aligned_snr_db(one_shot, streamed)
    assert snr >= 60, f"{kind} {in_rate}->{out_rate}: {snr:.1f} dB at lag {lag}"


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
def test_no_click_at_chunk_boundaries(in_rate: int, out_rate: int) -> None:
    """Compare per 20 ms block: a boundary glitch would sink one block's SNR even if the whole stays high."""
    signal = sine(in_rate, 0.5, 300.0)
    streamed = stream_in_chunks(StreamResampler(in_rate, out_rate), signal, in_rate * CHUNK_MS // 1000)
    one_shot = soxr.resample(signal, in_rate, out_rate, quality="HQ")
    block = out_rate * CHUNK_MS // 1000
    assert len(streamed) == len(one_shot)
    for start in range(0, len(one_shot) - block, block):
        a = one_shot[start : start + block].astype(np.float64)
        b = streamed[start : start + block].astype(np.float64)
        err = np.sum((a - b) ** 2)
        assert err == 0 or 10 * np.log10(np.sum(a**2) / err) >= 50, f"block at {start}"


@pytest.mark.parametrize(("in_rate", "out_rate"), RATE_PAIRS)
@pytest.mark.parametrize("chunk_samples", [1, 37, 160, 1000])
def test_sample_accounting_is_exact(in_rate: int, out_rate: int, chunk_samples: int) -> None:
    """Over a long stream: never ahead of in × ratio, behind it by at most the filter's latency,
    and exactly in × ratio (rounded) once flushed."""
    rng = np.random.default_rng(7)
    seconds = 3 if chunk_samples > 1 else 0.2
    signal = (rng.standard_normal(int(in_rate * seconds)) * 3000).astype(np.int16)
    resampler = StreamResampler(in_rate, out_rate)
    ratio = out_rate / in_rate
    latency_bound = 0.2 * out_rate  # soxr HQ holds under 100 ms at these rates; see bench/RESULTS.md
    for i in range(0, len(signal), chunk_samples):
        resampler.process(signal[i : i + chunk_samples].tobytes())
        owed = resampler.in_samples * ratio - resampler.out_samples
        assert -1 < owed <= latency_bound
    resampler.flush()
    assert resampler.in_samples == len(signal)
    assert abs(resampler.out_samples - len(signal) * ratio) < 1
    assert resampler.out_samples == len(soxr.resample(signal, in_rate, out_rate, quality="HQ"))


def test_held_samples_reported() -> None:
    resampler = StreamResampler(8000, 16000)
    resampler.process(np.zeros(160, dtype=np.int16).tobytes())
    assert resampler.held_samples == 320 - resampler.out_samples


@pytest.mark.parametrize("quality", [q for q in ResamplerQuality if q is not ResamplerQuality.LD])
def test_every_soxr_quality_streams(quality: ResamplerQuality) -> None:
    signal = sine(24000, 0.5)
    out = stream_in_chunks(StreamResampler(24000, 8000, quality), signal, 480)
    assert len(out) == 4000


def test_equal_rates_pass_through() -> None:
    resampler = StreamResampler(16000, 16000)
    data = sine(16000, 0.02).tobytes()
    assert resampler.process(data) == data
    assert resampler.flush() == b""


def test_odd_byte_chunk_rejected() -> None:
    with pytest.raises(ValueError, match="whole samples"):
        StreamResampler(8000, 16000).process(b"\x00" * (PCM16_SAMPLE_BYTES * 3 + 1))


def test_process_after_flush_rejected() -> None:
    resampler = StreamResampler(8000, 16000)
    resampler.flush()
    assert resampler.flush() == b""
    with pytest.raises(ValueError, match="after flush"):
        resampler.process(b"\x00\x00")


def test_streams_are_independent() -> None:
    """Two calls' resamplers never share state: interleaving equals running each alone
    (up to soxr's TPDF dither on int16 output, a couple of LSB)."""
    a, b = sine(8000, 0.2, 440), sine(8000, 0.2, 1200)
    alone_a = stream_in_chunks(StreamResampler(8000, 16000), a, 160)
    ra, rb = StreamResampler(8000, 16000), StreamResampler(8000, 16000)
    mixed_a = []
    for i in range(0, len(a), 160):
        mixed_a.append(ra.process(a[i : i + 160].tobytes()))
        rb.process(b[i : i + 160].tobytes())
    mixed_a.append(ra.flush())
    mixed = np.frombuffer(b"".join(mixed_a), dtype=np.int16).astype(np.int32)
    assert len(mixed) == len(alone_a)
    assert np.abs(mixed - alone_a).max() <= 3
