"""G.722 through sippy's libg722 (``callbridge/codecs/g722.py``): what we rely on of it — the sizes, the state kept
across a stream's packets, the band it carries that G.711 cannot, and the near silence it conceals a loss with."""

from __future__ import annotations

import numpy as np
import pytest

from callbridge.codecs import AudioEncoding, decode_to_pcm16, encode_from_pcm16
from callbridge.codecs.g722 import BYTES_PER_MS, RATE_HZ, SILENCE_BYTE, G722Decoder, G722Encoder
from callbridge.codecs.resample import ResamplerQuality, StreamResampler

pytestmark = pytest.mark.core

_DELAY = 22
"""The coder's delay, in samples at 16 kHz (its two quadrature mirror filters)."""


def tone(hz: float, ms: int, level: float = 8000.0) -> bytes:
    t = np.arange(RATE_HZ * ms // 1000) / RATE_HZ
    return (level * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()


def through(pcm: bytes, frame_ms: int = 20) -> bytes:
    """``pcm`` encoded and decoded in frames of ``frame_ms``, as a call's packets are."""
    encoder, decoder, step = G722Encoder(), G722Decoder(), 2 * RATE_HZ * frame_ms // 1000
    return b"".join(decoder.decode(encoder.encode(pcm[i : i + step])) for i in range(0, len(pcm), step))


def snr_db(sent: bytes, heard: bytes) -> float:
    a = np.frombuffer(sent, dtype="<i2").astype(np.float64)[: -_DELAY - 400]
    b = np.frombuffer(heard, dtype="<i2").astype(np.float64)[_DELAY : _DELAY + len(a)]
    return float(10 * np.log10(np.sum(a**2) / np.sum((a - b) ** 2)))


def test_twenty_ms_is_320_samples_in_160_bytes_and_back() -> None:
    encoder, decoder = G722Encoder(), G722Decoder()
    encoded = encoder.encode(tone(440, 20))
    assert len(encoded) == 20 * BYTES_PER_MS == 160
    assert len(decoder.decode(encoded)) == 640
    assert len(encoder.silence(20)) == 160


@pytest.mark.parametrize("hz", [300, 1000, 3000, 6000])
def test_a_tone_comes_back_clean_across_the_band_g711_cannot_carry_beyond_4_khz(hz: int) -> None:
    assert snr_db(tone(hz, 1000), through(tone(hz, 1000))) > 20
    down = StreamResampler(RATE_HZ, 8000, ResamplerQuality.HQ)
    narrow = (down.process(tone(hz, 1000)) + down.flush())[800:-800]
    kept = np.sqrt(np.mean(np.frombuffer(narrow, dtype="<i2").astype(np.float64) ** 2)) / (8000 / np.sqrt(2))
    assert (kept > 0.9) == (hz < 4000)  # what an 8 kHz leg keeps of it: nothing at 6 kHz


def test_the_state_runs_across_packets_a_stream_coded_in_pieces_is_coded_as_one() -> None:
    speechlike = (tone(220, 600, 4000) + tone(1700, 400, 3000)) * 2
    pieces = G722Encoder()
    assert b"".join(pieces.encode(speechlike[i : i + 640]) for i in range(0, len(speechlike), 640)) == G722Encoder().encode(speechlike)
    assert snr_db(speechlike, through(speechlike)) > 20


def test_a_coder_per_packet_would_not_do_so_each_stream_keeps_its_own() -> None:
    pcm = tone(1000, 200)
    one = G722Encoder()
    kept = b"".join(one.encode(pcm[i : i + 640]) for i in range(0, len(pcm), 640))
    fresh = b"".join(G722Encoder().encode(pcm[i : i + 640]) for i in range(0, len(pcm), 640))
    assert kept != fresh


def test_the_concealment_byte_decodes_to_near_silence() -> None:
    decoder = G722Decoder()
    decoder.decode(G722Encoder().encode(tone(500, 200)))  # mid-stream
    quiet = np.frombuffer(decoder.decode(bytes([SILENCE_BYTE]) * 160 * 3), dtype="<i2")
    assert np.abs(quiet[320:]).max() < 100  # after 20 ms: under -50 dBFS
    assert not any(G722Decoder().decode(bytes([SILENCE_BYTE]) * 160))  # from a fresh state: digital silence
    assert AudioEncoding.G722.silence_byte == SILENCE_BYTE and AudioEncoding.G722.sample_bytes == 1


def test_the_stateless_helpers_refuse_it() -> None:
    with pytest.raises(ValueError, match="keeps state"):
        decode_to_pcm16(AudioEncoding.G722, b"\x00" * 160)
    with pytest.raises(ValueError, match="keeps state"):
        encode_from_pcm16(AudioEncoding.G722, b"\x00" * 320)
