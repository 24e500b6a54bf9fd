"""G.711 against an independent reference (telephony-protocols.md §6), exhaustively."""

from __future__ import annotations

import numpy as np
import pytest

from callbridge.codecs import (
    AudioEncoding,
    alaw_to_pcm16,
    decode_to_pcm16,
    encode_from_pcm16,
    pcm16_to_alaw,
    pcm16_to_ulaw,
    ulaw_to_pcm16,
)
from tests.codecs import g711_reference as ref

pytestmark = pytest.mark.core

ALL_CODES = bytes(range(256))
ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)
ULAW_TABLE = np.array([ref.ulaw_decode(c) for c in range(256)], dtype=np.int16)
ALAW_TABLE = np.array([ref.alaw_decode(c) for c in range(256)], dtype=np.int16)


def pcm(*samples: int) -> bytes:
    return np.array(samples, dtype="<i2").tobytes()


def samples(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2")


class TestReferenceVectors:
    """§6.3, first table: code → PCM."""

    @pytest.mark.parametrize(
        ("code", "expected"),
        [(0xFF, 0), (0x7F, 0), (0xFE, 8), (0x7E, -8), (0xF0, 120), (0xEF, 132), (0x80, 32124), (0x00, -32124)],
    )
    def test_ulaw_decode(self, code: int, expected: int) -> None:
        assert samples(ulaw_to_pcm16(bytes([code]))).tolist() == [expected]
        assert ref.ulaw_decode(code) == expected

    @pytest.mark.parametrize(
        ("code", "expected"),
        [(0xD5, 8), (0x55, -8), (0xD4, 24), (0x54, -24), (0x80, 5504), (0x00, -5504), (0xAA, 32256), (0x2A, -32256)],
    )
    def test_alaw_decode(self, code: int, expected: int) -> None:
        assert samples(alaw_to_pcm16(bytes([code]))).tolist() == [expected]
        assert ref.alaw_decode(code) == expected

    @pytest.mark.parametrize(
        ("sample", "ulaw", "alaw"),
        [
            (0, 0xFF, 0xD5), (1, 0xFF, 0xD5), (2, 0xFF, 0xD5), (3, 0xFF, 0xD5),
            (-1, 0x7E, 0x55), (-2, 0x7E, 0x55),  # audioop's μ-law column (Sun formulation)
            (4, 0xFE, 0xD5), (8, 0xFE, 0xD5), (-4, 0x7E, 0x55), (-8, 0x7E, 0x55),
            (100, 0xF2, 0xD3), (-100, 0x72, 0x53), (1000, 0xCE, 0xFA),
            (32767, 0x80, 0xAA), (32635, 0x80, 0xAA), (-32768, 0x00, 0x2A), (-32635, 0x00, 0x2A),
        ],
    )  # fmt: skip
    def test_encode(self, sample: int, ulaw: int, alaw: int) -> None:
        assert pcm16_to_ulaw(pcm(sample)) == bytes([ulaw])
        assert pcm16_to_alaw(pcm(sample)) == bytes([alaw])

    def test_bias_clip_formulation_differs_on_minus_one(self) -> None:
        assert ref.ulaw_encode_bias_clip(-1) == 0x7F
        assert ref.ulaw_encode_sun(-1) == 0x7E

    def test_silence(self) -> None:
        assert AudioEncoding.PCMU.silence_byte == 0xFF
        assert AudioEncoding.PCMA.silence_byte == 0xD5
        assert samples(ulaw_to_pcm16(b"\xff" * 4)).tolist() == [0] * 4
        assert pcm16_to_alaw(pcm(0, 0)) == b"\xd5\xd5"


class TestAllCodes:
    """Every one of the 256 codes decodes to the definition's value."""

    def test_ulaw_table(self) -> None:
        np.testing.assert_array_equal(samples(ulaw_to_pcm16(ALL_CODES)), ULAW_TABLE)
        assert ULAW_TABLE.max() == 32124 and ULAW_TABLE.min() == -32124

    def test_alaw_table(self) -> None:
        np.testing.assert_array_equal(samples(alaw_to_pcm16(ALL_CODES)), ALAW_TABLE)
        assert ALAW_TABLE.max() == 32256 and ALAW_TABLE.min() == -32256

    def test_ulaw_round_trip_is_identity_but_negative_zero(self) -> None:
        back = pcm16_to_ulaw(ulaw_to_pcm16(ALL_CODES))
        differing = [code for code, again in zip(ALL_CODES, back, strict=True) if code != again]
        assert differing == [0x7F]
        assert back[0x7F] == 0xFF

    def test_alaw_round_trip_is_identity(self) -> None:
        assert pcm16_to_alaw(alaw_to_pcm16(ALL_CODES)) == ALL_CODES


def _assert_within_one_step(table: np.ndarray, inputs: np.ndarray, decoded: np.ndarray) -> None:
    """Each decoded value is a neighbour of its input on the code grid: the grid point
    just below or just above it (or the end point, outside the grid's range)."""
    grid = np.unique(table.astype(np.int32))
    x = inputs.astype(np.int32)
    above = np.clip(np.searchsorted(grid, x, side="left"), 0, len(grid) - 1)
    below = np.clip(np.searchsorted(grid, x, side="right") - 1, 0, len(grid) - 1)
    y = decoded.astype(np.int32)
    ok = (y == grid[above]) | (y == grid[below])
    assert ok.all(), f"{int((~ok).sum())} inputs off by more than one step, first {x[~ok][:5]}"


class TestAllSamples:
    """decode∘encode over all 65,536 PCM16 inputs."""

    def test_ulaw_error_within_one_step(self) -> None:
        decoded = samples(ulaw_to_pcm16(pcm16_to_ulaw(ALL_SAMPLES.tobytes())))
        _assert_within_one_step(ULAW_TABLE, ALL_SAMPLES, decoded)

    def test_alaw_error_within_one_step(self) -> None:
        decoded = samples(alaw_to_pcm16(pcm16_to_alaw(ALL_SAMPLES.tobytes())))
        _assert_within_one_step(ALAW_TABLE, ALL_SAMPLES, decoded)

    def test_alaw_encoder_equals_definition(self) -> None:
        expected = bytes(ref.alaw_encode(int(s)) for s in ALL_SAMPLES)
        assert pcm16_to_alaw(ALL_SAMPLES.tobytes()) == expected

    def test_ulaw_encoder_equals_sun_formulation(self) -> None:
        expected = bytes(ref.ulaw_encode_sun(int(s)) for s in ALL_SAMPLES)
        assert pcm16_to_ulaw(ALL_SAMPLES.tobytes()) == expected

    def test_ulaw_bias_clip_differs_on_381_negative_inputs_by_one_step(self) -> None:
        ours = pcm16_to_ulaw(ALL_SAMPLES.tobytes())
        diffs = [
            (int(s), code, ref.ulaw_encode_bias_clip(int(s)))
            for s, code in zip(ALL_SAMPLES, ours, strict=True)
            if code != ref.ulaw_encode_bias_clip(int(s))
        ]
        assert len(diffs) == 381
        assert all(s < 0 for s, _, _ in diffs)
        assert min(s for s, _, _ in diffs) == -31611 and max(s for s, _, _ in diffs) == -1
        assert all(abs(a - b) == 1 for _, a, b in diffs)


class TestDispatch:
    @pytest.mark.parametrize("encoding", [e for e in AudioEncoding if e not in (AudioEncoding.G722, AudioEncoding.OPUS)])  # stateful: test_g722.py, test_opus.py
    def test_round_trip_through_encoding(self, encoding: AudioEncoding) -> None:
        tone = (np.sin(np.arange(160) * 2 * np.pi / 20) * 8000).astype("<i2").tobytes()
        wire = encode_from_pcm16(encoding, tone)
        assert len(wire) == 160 * encoding.sample_bytes
        back = samples(bytes(decode_to_pcm16(encoding, wire)))
        np.testing.assert_allclose(back, samples(tone), atol=256)

    def test_l16_be_is_network_order(self) -> None:
        assert bytes(encode_from_pcm16(AudioEncoding.L16_BE, pcm(0x0102))) == b"\x01\x02"
        assert samples(bytes(decode_to_pcm16(AudioEncoding.L16_BE, b"\x01\x02"))).tolist() == [0x0102]

    def test_l16_passes_through_without_copy(self) -> None:
        data = pcm(1, 2, 3)
        assert decode_to_pcm16(AudioEncoding.L16, data) is data


def test_rms() -> None:
    from callbridge.codecs import pcm16_rms

    assert pcm16_rms(pcm(0, 0, 0, 0)) == 0
    assert pcm16_rms(pcm(1000, -1000, 1000, -1000)) == 1000
