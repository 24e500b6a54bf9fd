"""Opus through libopus (``callbridge/codecs/opus.py``): what we rely on of it — 20 ms in, one packet out and back at
16 kHz, the band G.711 cannot carry, a peer's fullband packet decoded at our rate, and a lost packet concealed from
the next one's FEC better than by guessing; and the one-line reason when libopus is missing."""

from __future__ import annotations

import ctypes
import ctypes.util
from datetime import UTC, datetime

import numpy as np
import pytest

from callbridge.carriers.sip.settings import SipSettings
from callbridge.codecs import AudioEncoding, decode_to_pcm16, encode_from_pcm16, opus
from callbridge.codecs.opus import RATE_HZ, OpusDecoder, OpusEncoder, OpusUnavailable
from tests.conftest import NEEDS_LIBOPUS

pytestmark = [pytest.mark.core, NEEDS_LIBOPUS]


def voiced(ms: int, level: float = 3000.0) -> bytes:
    """A voiced sound: a gliding 140 Hz pitch with 40 harmonics (up to 5.6 kHz), its level swelling 4 times a second."""
    t = np.arange(RATE_HZ * ms // 1000) / RATE_HZ
    phase = np.cumsum(2 * np.pi * (140 + 30 * np.sin(2 * np.pi * 2 * t)) / RATE_HZ)
    wave = sum(np.sin(k * phase) / k for k in range(1, 40)) * (1 + np.sin(2 * np.pi * 4 * t)) * level
    return np.asarray(wave).astype("<i2").tobytes()


def tone(hz: float, ms: int, level: float = 8000.0) -> bytes:
    t = np.arange(RATE_HZ * ms // 1000) / RATE_HZ
    return (level * np.sin(2 * np.pi * hz * t)).astype("<i2").tobytes()


def packets(pcm: bytes, encoder: OpusEncoder | None = None) -> list[bytes]:
    coder = encoder or OpusEncoder()
    return [coder.encode(pcm[i : i + 640]) for i in range(0, len(pcm), 640)]


def snr_db(reference: bytes, heard: bytes) -> float:
    a = np.frombuffer(reference, dtype="<i2").astype(np.float64)
    b = np.frombuffer(heard, dtype="<i2").astype(np.float64)
    return float(10 * np.log10(np.sum(a**2) / max(np.sum((a - b) ** 2), 1.0)))


def test_twenty_ms_is_one_packet_of_a_few_dozen_bytes_and_decodes_to_640_bytes() -> None:
    encoded = packets(voiced(1000))
    assert len(encoded) == 50 and all(1 <= len(packet) <= 200 for packet in encoded)
    assert 40 <= sum(map(len, encoded[5:])) / 45 <= 100  # at most 32 kbit/s is 80 bytes a packet, FEC within it
    decoder = OpusDecoder()
    assert all(len(decoder.decode(packet)) == 640 for packet in encoded)
    assert 1 <= len(OpusEncoder().silence(20)) <= 20  # silence costs next to nothing


@pytest.mark.parametrize("hz", [300, 1000, 3000, 6000])
def test_a_tone_comes_back_at_its_frequency_across_the_band_g711_cannot_carry_beyond_4_khz(hz: int) -> None:
    decoder = OpusDecoder()
    heard = np.frombuffer(b"".join(decoder.decode(p) for p in packets(tone(hz, 1000))), dtype="<i2")[3200:].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(heard))
    assert abs(np.argmax(spectrum) * RATE_HZ / len(heard) - hz) < 20
    assert np.sqrt(np.mean(heard**2)) > 0.5 * 8000 / np.sqrt(2)


def test_a_fullband_peers_packets_decode_at_our_16_khz() -> None:
    """A softphone or WebRTC peer encodes at 48 kHz: libopus decodes its packets at our rate, no resampler of ours."""
    lib = opus.library()
    error = ctypes.c_int()
    peer = ctypes.c_void_p(lib.opus_encoder_create(48000, 1, 2048, ctypes.byref(error)))
    t = np.arange(960) / 48000
    frame = (8000 * np.sin(2 * np.pi * 1000 * t)).astype("<i2").tobytes()
    out = ctypes.create_string_buffer(1500)
    try:
        size = lib.opus_encode(peer, frame, 960, out, 1500)
    finally:
        lib.opus_encoder_destroy(peer)
    assert size > 0 and len(OpusDecoder().decode(ctypes.string_at(out, size))) == 640


def test_a_lost_packet_is_rebuilt_from_the_next_ones_fec_far_better_than_concealment_guesses_it() -> None:
    encoded = packets(voiced(2000))
    whole = OpusDecoder()
    reference_audio = [whole.decode(p) for p in encoded]
    for lost in (30, 55, 77):
        from_fec, guessed = OpusDecoder(), OpusDecoder()
        rebuilt = [from_fec.decode(p) if i != lost else from_fec.conceal(encoded[i + 1]) for i, p in enumerate(encoded)]
        concealed = [guessed.decode(p) if i != lost else guessed.conceal() for i, p in enumerate(encoded)]
        assert len(rebuilt[lost]) == len(concealed[lost]) == 640
        assert snr_db(reference_audio[lost], rebuilt[lost]) > 10 > snr_db(reference_audio[lost], concealed[lost]) + 3


def test_a_packet_libopus_cannot_read_is_concealed_not_raised() -> None:
    decoder = OpusDecoder()
    decoder.decode(packets(voiced(40))[0])
    assert len(decoder.decode(b"\xff\xff\xff")) == 640  # code 3 with a bad frame count: concealed as a 20 ms packet


def test_opus_is_coded_at_the_edge_not_by_the_bridges_stateless_helpers() -> None:
    with pytest.raises(ValueError, match="keeps state"):
        decode_to_pcm16(AudioEncoding.OPUS, b"\x00" * 40)
    with pytest.raises(ValueError, match="keeps state"):
        encode_from_pcm16(AudioEncoding.OPUS, b"\x00" * 640)
    with pytest.raises(KeyError):
        AudioEncoding.OPUS.silence_byte  # noqa: B018 — it has none: its decoder conceals


def test_without_libopus_the_reason_is_one_line_that_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file")

    opus.library.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", missing)
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    try:
        assert opus.problem() == "libopus is not installed (Debian/Ubuntu: apt-get install libopus0; macOS: brew install opus)"
        problems = SipSettings(enabled=True, codecs=["PCMU", "opus"]).file_problems(datetime.now(UTC))
        assert problems == [f"sip.codecs names opus: {opus.problem()}"]  # what `callbridge config check` prints
        assert SipSettings(enabled=True).file_problems(datetime.now(UTC)) == []  # without opus, libopus is not needed
        with pytest.raises(OpusUnavailable):
            OpusEncoder()
    finally:
        monkeypatch.undo()
        opus.library.cache_clear()
    assert opus.problem() is None


def test_without_fec_the_next_packet_rebuilds_nothing_and_costs_less_to_make() -> None:
    """``sip.opus_fec`` off: packets carry no copy of the last one, so a loss is only concealed (and the encoder runs at
    a lower complexity: ``COMPLEXITY_WITHOUT_FEC``)."""
    encoded = packets(voiced(2000), OpusEncoder(fec=False))
    whole = OpusDecoder()
    reference_audio = [whole.decode(p) for p in encoded]
    from_next, guessed = OpusDecoder(), OpusDecoder()
    rebuilt = [from_next.decode(p) if i != 55 else from_next.conceal(encoded[i + 1]) for i, p in enumerate(encoded)]
    concealed = [guessed.decode(p) if i != 55 else guessed.conceal() for i, p in enumerate(encoded)]
    assert abs(snr_db(reference_audio[55], rebuilt[55]) - snr_db(reference_audio[55], concealed[55])) < 0.5
    assert opus.COMPLEXITY_WITHOUT_FEC < opus.COMPLEXITY_WITH_FEC
